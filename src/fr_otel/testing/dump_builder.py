"""Build Flight Recorder dumps by hand, in the NCCL or gloo shape, as pickle or JSON.

Specification tests need exact scenarios (a pipeline stage that never posts a
recv, a rank late on only its last collectives, a group name shared by two
member sets) that no CPU-only torch can produce: gloo records no send/recv and
never hangs on a device. This builder writes what the recorder would write,
field for field (see docs on the dump layout): per-rank record ids, per-group
collective and p2p counters, local ``pg_id`` slots that differ between ranks,
``pg_status`` that tracks the p2p counter in groups carrying send/recv (as NCCL
does), JSON's quirks (string counters, 0 for missing times, lists for tuples,
no frames) and gloo's (always ``scheduled``, ``retired`` as progress, an empty
``pg_config``). No torch import.

    job = DumpBuilder(world_size=4)
    pp = job.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1, 2, 3])
    job.send(pp, 1, 2, done=False)          # stage 1 waits to send to stage 2
    job.write(tmp / "pickle")                # one file per rank
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..common.files import atomic_write

__all__ = ["DumpBuilder", "Sizes"]

Sizes = Sequence[Sequence[int]]

_START_NS = 1_750_000_000_000_000_000
_STEP_NS = 1_000_000  # 1 ms between consecutive ops of the job's clock
_TIMEOUT_MS = 600_000


@dataclass
class _Group:
    name: str
    desc: str
    ranks: tuple[int, ...]  # global ranks, in group-local order


@dataclass
class _Rank:
    rank: int
    entries: list[dict[str, Any]] = field(default_factory=list)
    slots: dict[str, int] = field(default_factory=dict)  # group key -> local pg_id
    seq: dict[str, int] = field(default_factory=dict)  # collective counter per group
    p2p: dict[str, int] = field(default_factory=dict)  # p2p counter per group
    done_seq: dict[str, int] = field(default_factory=dict)
    done_p2p: dict[str, int] = field(default_factory=dict)


class DumpBuilder:
    """A job whose ranks record collectives and send/recv; ``write`` dumps every rank."""

    def __init__(self, world_size: int, *, backend: str = "nccl") -> None:
        self.world_size = world_size
        self.backend = backend
        self.groups: dict[str, _Group] = {}
        self.ranks = {r: _Rank(r) for r in range(world_size)}
        self.clock = _START_NS
        self.world = self.group("0", "default_pg", range(world_size))

    # -- groups -------------------------------------------------------------

    def group(self, name: str, desc: str, ranks: Iterable[int]) -> str:
        """Create a group (members in group-local order); returns its key for the other calls.

        The same ``name`` may be given to different member sets (split groups named by
        the user): each call is its own group, each rank records the one it is in.
        """
        members = tuple(ranks)
        key = name if name not in self.groups else f"{name}#{len(self.groups)}"
        self.groups[key] = _Group(name, desc, members)
        for r in members:
            st = self.ranks[r]
            st.slots[key] = len(st.slots)
        return key

    # -- ops ----------------------------------------------------------------

    def collective(
        self, group: str, op: str = "all_reduce", sizes: Sizes = ((4,),), dtype: str = "Float", *,
        ranks: Iterable[int] | None = None, done: bool | Iterable[int] = True,
        late_s: Mapping[int, float] | None = None, per_rank: Mapping[int, Mapping[str, Any]] | None = None,
        coalesced: Sequence[tuple[str, Sizes, str]] | None = None,
    ) -> None:
        """Every rank in ``ranks`` (default: all members) enqueues the group's next collective.

        ``done``: True (all complete), False (none), or the ranks that completed it.
        ``late_s``: per-rank enqueue delay. ``per_rank``: overrides of op/sizes/dtype (a
        mismatch). ``coalesced``: the ops of a coalesced group (one entry each plus a
        ``coalesced`` entry sharing the sequence number, as NCCL writes them).
        """
        g = self.groups[group]
        who = tuple(g.ranks if ranks is None else ranks)
        finished = set(g.ranks) if done is True else set() if done is False else set(done)
        base = self._tick()
        for r in who:
            st = self.ranks[r]
            seq = st.seq.get(group, 0) + 1
            st.seq[group] = seq
            when = base + int((late_s or {}).get(r, 0.0) * 1e9)
            over = dict((per_rank or {}).get(r, {}))
            ops = over.pop("coalesced", coalesced)
            parts = [(over.get("op", op), over.get("sizes", sizes), over.get("dtype", dtype))] if ops is None else list(ops)
            for i, (name, sz, dt) in enumerate(parts):
                self._record(st, group, name, sz, dt, seq, r in finished, when + i, p2p=False)
            if ops is not None:
                self._record(st, group, "coalesced", (), "", seq, r in finished, when + len(parts), p2p=False)
            if r in finished:
                st.done_seq[group] = seq

    def send(self, group: str, src: int, dst: int, sizes: Sizes = ((4,),), dtype: str = "Float", *,
             done: bool = True) -> None:
        """Global rank ``src`` posts a send to global rank ``dst`` (recorded as ``send a->b``, local ranks)."""
        g = self.groups[group]
        label = f"send {g.ranks.index(src)}->{g.ranks.index(dst)}"
        self._p2p(group, src, label, sizes, dtype, done)

    def recv(self, group: str, dst: int, src: int | None, sizes: Sizes = ((4,),), dtype: str = "Float", *,
             done: bool = True) -> None:
        """Global rank ``dst`` posts a recv from ``src`` (None: any source, ``recv a<-?``)."""
        g = self.groups[group]
        peer = "?" if src is None else str(g.ranks.index(src))
        self._p2p(group, dst, f"recv {g.ranks.index(dst)}<-{peer}", sizes, dtype, done)

    def transfer(self, group: str, src: int, dst: int, sizes: Sizes = ((4,),), dtype: str = "Float", *,
                 done: bool = True) -> None:
        """A send and its recv, both posted (completed unless ``done`` is False)."""
        self.send(group, src, dst, sizes, dtype, done=done)
        self.recv(group, dst, src, sizes, dtype, done=done)

    def _p2p(self, group: str, rank: int, label: str, sizes: Sizes, dtype: str, done: bool) -> None:
        st = self.ranks[rank]
        n = st.p2p.get(group, 0) + 1
        st.p2p[group] = n
        self._record(st, group, label, sizes, dtype, st.seq.get(group, 0), done, self._tick(), p2p=True)
        if done:
            st.done_p2p[group] = n

    def _tick(self) -> int:
        self.clock += _STEP_NS
        return self.clock

    def _record(self, st: _Rank, group: str, op: str, sizes: Sizes, dtype: str, seq: int, done: bool,
                created: int, *, p2p: bool) -> None:
        g = self.groups[group]
        gloo = self.backend == "gloo"
        state = "scheduled" if gloo else ("completed" if done else "scheduled")
        shapes = [list(s) for s in sizes]
        dtypes = [dtype] * len(shapes)
        st.entries.append({
            "record_id": len(st.entries),
            "pg_id": st.slots[group],
            "process_group": (g.name, g.desc),
            "collective_seq_id": seq,
            "p2p_seq_id": st.p2p.get(group, 0) if p2p else 0,
            "op_id": seq + st.p2p.get(group, 0),
            "profiling_name": f"{self.backend}:{op}",
            "time_created_ns": created,
            "input_sizes": shapes,
            "input_dtypes": dtypes,
            "output_sizes": shapes,
            "output_dtypes": dtypes,
            "state": state,
            "time_discovered_started_ns": None,
            "time_discovered_completed_ns": created + _STEP_NS // 2 if done and not gloo else None,
            "retired": done,
            "timeout_ms": _TIMEOUT_MS,
            "is_p2p": p2p,
            "thread_name": "pt_main_thread",
            "thread_id": str(1000 + st.rank),
            "frames": [{"name": "train_step", "filename": "/job/train.py", "line": 42}],
        })

    # -- output -------------------------------------------------------------

    def dump(self, rank: int, *, fmt: str = "pickle", only_active: bool = False) -> bytes:
        """One rank's dump as the recorder would write it."""
        st = self.ranks[rank]
        entries = st.entries
        if only_active:
            entries = [e for e in entries if not e["retired"]]
        gloo = self.backend == "gloo"
        if gloo:
            # torch 2.13 gloo: recorded before the groups had names (see docs).
            config = {"": {"name": "", "desc": "", "ranks": "[]"}}
        else:
            config = {}
            for key, g in self.groups.items():
                if rank in g.ranks or key == self.world:
                    config[g.name] = {"name": g.name, "desc": g.desc, "ranks": str(sorted(g.ranks))}
        status = {}
        for key, slot in st.slots.items():
            p2p = st.p2p.get(key, 0)
            # NCCL tracks the p2p counter where a group carries send/recv (see docs).
            enq, done = (p2p, st.done_p2p.get(key, 0)) if p2p else (st.seq.get(key, 0), st.done_seq.get(key, 0))
            status[slot] = {"last_enqueued_collective": enq, "last_started_collective": -1,
                            "last_completed_collective": done}
        body: dict[str, Any] = {
            "version": "2.10",
            "comm_lib_version": "" if gloo else "2.21.5",
            "pg_config": config,
            "pg_status": status,
            "entries": entries,
        }
        if fmt == "pickle":
            return pickle.dumps(body, protocol=2)
        if fmt != "json":
            raise ValueError(f"fmt must be 'pickle' or 'json', not {fmt!r}")
        body["pg_status"] = {str(k): {kk: str(vv) for kk, vv in v.items()} for k, v in status.items()}
        body["entries"] = [_json_entry(e) for e in entries]
        if not body["entries"]:
            del body["entries"]  # JSON dumps omit an empty ring
        return json.dumps(body).encode()

    def write(self, folder: str | Path, *, fmt: str = "pickle", only_active: bool = False,
              omit: Iterable[int] = (), prefix: str = "nccl_trace_rank_") -> Path:
        """Write ``<prefix><rank>`` for every rank but ``omit``; returns the folder."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        skip = set(omit)
        for r in self.ranks:
            if r not in skip:
                atomic_write(out / f"{prefix}{r}", self.dump(r, fmt=fmt, only_active=only_active))
        return out


def _json_entry(e: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in e.items() if k != "frames"}
    out["process_group"] = list(e["process_group"])
    for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
        out[k] = out[k] or 0
    return out
