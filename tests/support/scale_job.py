"""A Megatron-like job of any size, simulated as the agents' payloads: the scale tests' and the bench's.

Each rank's recorder is built in torch's dump shape (NCCL) and turned into the payload its agent
would send by the real :func:`fr_otel.agent.observe.payload.encode_payload`, with its host (8 ranks per
node, ``node00042``) and its training steps. Groups: TP 8 (one node), PP 4 below 16k ranks, 8 at
16k and 64k, 10 at 100k, DP the rest; rank = pp*(DP*TP) + dp*TP + tp. One iteration (one training
step) is 3 TP all_reduce, PP send + recv, DP reduce_scatter + all_gather and a world all_reduce,
which every rank has in flight at the end, except as a fault says:

- ``stopped``: rank ``rank`` never enqueued the last world all_reduce;
- ``node_behind``: no rank of ``rank``'s node enqueued it (nothing stands out on that node);
- ``gpu_stall``: rank ``rank`` is stuck in the TP all_reduce before it, which its TP peers completed;
- ``lost_node``: as ``stopped`` for nobody, but ``rank``'s node sends nothing (see :func:`lost_ranks`).

Only the newest entries are built (enough for the payload's trim: the same bytes as from a full
2000-entry recorder, which the bench checks on a sample rank).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BULK_ENTRIES",
    "ENTRIES",
    "ITERATION",
    "KEEP",
    "NO_FAULT",
    "RANKS_PER_NODE",
    "Fault",
    "Layout",
    "bulk_entries",
    "host_of",
    "layout_for",
    "lost_ranks",
    "make_payloads",
    "make_summaries",
    "node_of",
    "payload_for",
    "raw_recorder",
]

TP = 8
RANKS_PER_NODE = 8
ENTRIES = 2000
KEEP = 64  # FR_OTEL_INCIDENT_ENTRIES default
# One iteration, in record order: (group kind, op, p2p)
ITERATION = (("tp", "all_reduce", False), ("pp", "send", True), ("tp", "all_reduce", False), ("pp", "recv", True),
             ("dp", "reduce_scatter", False), ("dp", "all_gather", False), ("tp", "all_reduce", False),
             ("world", "all_reduce", False))
#: Enough of the newest entries for the payload's trim to keep 64 per group.
BULK_ENTRIES = 9 * len(ITERATION) * KEEP // 8 + 16
_STEPS_KEPT = 96  # step starts a payload carries here (an agent keeps up to 512): more than its columns span
_ITER_NS = 16_000_000  # one iteration: 8 ops 2 ms apart
_TOTAL_ITERS = 10_000  # the job ran a while: sequence numbers do not start at 1


@dataclass(frozen=True)
class Layout:
    world: int
    tp: int
    pp: int

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    def groups(self, rank: int) -> dict[str, tuple[str, str, tuple[int, ...], int]]:
        """kind -> (group name, desc, member ranks, local slot), names in creation order as torch gives them."""
        tp_i, dp_i, pp_i = rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp)
        n_tp, n_dp = self.world // self.tp, self.world // self.dp
        tp_idx = pp_i * self.dp + dp_i
        dp_idx = pp_i * self.tp + tp_i
        pp_idx = dp_i * self.tp + tp_i
        stride = self.tp * self.dp
        return {
            "world": ("0", "default_pg", _everyone(self.world), 0),
            "tp": (str(1 + tp_idx), "TENSOR_MODEL_PARALLEL_GROUP", tuple(range(tp_idx * self.tp, tp_idx * self.tp + self.tp)), 1),
            "dp": (str(1 + n_tp + dp_idx), "DATA_PARALLEL_GROUP", tuple(pp_i * stride + d * self.tp + tp_i for d in range(self.dp)), 2),
            "pp": (str(1 + n_tp + n_dp + pp_idx), "PIPELINE_MODEL_PARALLEL_GROUP", tuple(dp_i * self.tp + tp_i + p * stride for p in range(self.pp)), 3),
        }


_EVERYONE: dict[int, tuple[int, ...]] = {}


def _everyone(world: int) -> tuple[int, ...]:
    if world not in _EVERYONE:
        _EVERYONE[world] = tuple(range(world))
    return _EVERYONE[world]


def layout_for(world: int) -> Layout:
    pp = 4 if world < 16384 else 8 if world % (TP * 8) == 0 else 10
    assert world % (TP * pp) == 0, f"{world} ranks do not split into TP {TP} x PP {pp}"
    return Layout(world, TP, pp)


@dataclass(frozen=True)
class Fault:
    kind: str  # stopped | node_behind | gpu_stall | lost_node
    rank: int

    @property
    def node(self) -> range:
        first = self.rank - self.rank % RANKS_PER_NODE
        return range(first, first + RANKS_PER_NODE)


def node_of(rank: int) -> range:
    first = rank - rank % RANKS_PER_NODE
    return range(first, first + RANKS_PER_NODE)


def host_of(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE:05d}"


def lost_ranks(fault: Fault) -> set[int]:
    """The ranks that send nothing at all."""
    return set(fault.node) if fault.kind == "lost_node" else set()


_ORDINAL = [sum(1 for k, _, _ in ITERATION[:j] if k == ITERATION[j][0]) for j in range(len(ITERATION))]
_COUNT = {"tp": 3, "pp": 2, "dp": 2, "world": 1}
_SITES = {kind: [{"name": kind + "_step", "filename": "/workspace/megatron/core/pipeline.py", "line": 100 + i},
                 {"name": "train_step", "filename": "/workspace/megatron/training.py", "line": 700},
                 {"name": "<module>", "filename": "/workspace/pretrain_gpt.py", "line": 42}]
          for i, kind in enumerate(("tp", "pp", "dp", "world"))}
_SIZES = {"tp": [[4096, 1024]], "pp": [[1, 4096, 1024]], "dp": [[16777216]], "world": [[1]]}


def raw_recorder(layout: Layout, rank: int, fault: Fault, n_entries: int, t_end_ns: int) -> dict[str, Any]:
    """The newest ``n_entries`` of this rank's recorder, in torch's dump shape (NCCL)."""
    groups = layout.groups(rank)
    n_iter = -(-n_entries // len(ITERATION)) + 1
    stream = [(it, j) for it in range(_TOTAL_ITERS - n_iter, _TOTAL_ITERS) for j in range(len(ITERATION))]
    behind = (fault.kind in ("stopped", "gpu_stall") and rank == fault.rank) or (
        fault.kind == "node_behind" and rank in fault.node)
    if behind:
        stream = stream[:-1]  # never enqueued the last world all_reduce
    stream = stream[-n_entries:]
    last = len(stream) - 1
    # in flight: the world all_reduce, where it was enqueued; on a stalled GPU, the TP all_reduce before it
    in_flight_at = last if not behind else last if fault.kind == "gpu_stall" else -1
    entries = []
    t0 = t_end_ns - 600 * 10**9  # the hang began 10 minutes before the dump
    skew = (rank * 7919) % 300_000
    for i, (it, j) in enumerate(stream):
        kind, op, p2p = ITERATION[j]
        name, desc, _, slot = groups[kind]
        seq = it * _COUNT[kind] + _ORDINAL[j] + 1
        created = _created(t0, it, j) + skew
        in_flight = i == in_flight_at
        sizes = _SIZES[kind]
        entries.append({
            "frames": _SITES[kind], "record_id": it * len(ITERATION) + j, "pg_id": slot,
            "process_group": (name, desc), "thread_name": "python", "thread_id": str(140000000000000 + rank),
            "collective_seq_id": 0 if p2p else seq, "p2p_seq_id": seq if p2p else 0, "op_id": it * len(ITERATION) + j,
            "profiling_name": f"nccl:{op}", "time_created_ns": created,
            "input_sizes": sizes, "input_dtypes": ["BFloat16"], "output_sizes": sizes, "output_dtypes": ["BFloat16"],
            "state": "scheduled" if in_flight else "completed",
            "time_discovered_started_ns": None if in_flight else created + 10_000,
            "time_discovered_completed_ns": None if in_flight else created + 900_000 + (rank % 7) * 1000,
            "retired": not in_flight, "timeout_ms": 600_000, "is_p2p": p2p, "duration_ms": None if in_flight else 0.89,
        })
    status: dict[str, dict[str, int]] = {}
    for e in entries:
        if e["is_p2p"]:
            continue
        st = status.setdefault(str(e["pg_id"]), {"last_enqueued_collective": -1, "last_started_collective": -1,
                                                  "last_completed_collective": -1})
        st["last_enqueued_collective"] = e["collective_seq_id"]
        if e["state"] == "completed":
            st["last_started_collective"] = st["last_completed_collective"] = e["collective_seq_id"]
    return {"version": "2.10", "pg_config": {}, "pg_status": status, "comm_lib_version": "2.21.5",
            "entries": entries}


def _created(t0: int, it: int, j: int) -> int:
    return t0 - (_TOTAL_ITERS - 1 - it) * _ITER_NS + (j - len(ITERATION) + 1) * (_ITER_NS // len(ITERATION))


def _steps(t0: int, skew: int) -> Any:
    from fr_otel.read.steps import RING, StepLog

    first = _TOTAL_ITERS - min(RING, _STEPS_KEPT)
    return StepLog(step=_TOTAL_ITERS - 1, source="optimizer",
                   starts=tuple((it, _created(t0, it, 0) + skew - 1000) for it in range(first, _TOTAL_ITERS)))


def bulk_entries(world: int) -> int:
    """The newest entries enough for the payload's trim at this world size (the same bytes as all of them)."""
    from fr_otel.agent.observe.payload import entries_per_group

    return 9 * len(ITERATION) * entries_per_group(KEEP, world) // 8 + 16


def payload_for(layout: Layout, rank: int, fault: Fault, t_end_ns: int, n_entries: int | None = None) -> bytes:
    """What rank ``rank``'s agent sends at the incident (its recorder trimmed, groups, host, steps)."""
    n = bulk_entries(layout.world) if n_entries is None else n_entries
    raw = pickle.dumps(raw_recorder(layout, rank, fault, n, t_end_ns), protocol=2)
    return encode(layout, rank, raw, t_end_ns)


def encode(layout: Layout, rank: int, raw: bytes, t_end_ns: int) -> bytes:
    """The agent's own encoding of a recorder's bytes at an incident."""
    from fr_otel.agent.observe.payload import encode_payload, entries_per_group
    from fr_otel.agent.observe.recorder import GroupInfo
    from fr_otel.read.rank_process import RankProcess

    groups = [GroupInfo(name=n, desc=d, ranks=r, local_id=s) for n, d, r, s in layout.groups(rank).values()]
    process = RankProcess(host=host_of(rank), pid=10_000 + rank % RANKS_PER_NODE, local_rank=rank % RANKS_PER_NODE,
                          source="agent")
    t0 = t_end_ns - 600 * 10**9
    return encode_payload(raw, groups, entries_per_group(KEEP, layout.world), t_end_ns, process,
                          steps=_steps(t0, (rank * 7919) % 300_000))


def _some_payloads(world: int, fault: Fault, t_end_ns: int, ranks: list[int]) -> dict[int, bytes]:
    layout = layout_for(world)
    return {r: payload_for(layout, r, fault, t_end_ns) for r in ranks}


NO_FAULT = Fault("stopped", -1)


def make_payloads(world: int, fault: Fault, t_end_ns: int, workers: int = 2,
                  base: dict[int, bytes] | None = None) -> dict[int, bytes]:
    """Every rank's payload but the lost ones', made by ``workers`` forked processes; with ``base`` (the
    payloads of the same job without a fault, same ``t_end_ns``) only the fault's node is made anew."""
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial
    from multiprocessing import get_context

    if base is not None:
        out = {r: p for r, p in base.items() if r not in lost_ranks(fault)}
        out.update(_some_payloads(world, fault, t_end_ns, [r for r in fault.node if r not in lost_ranks(fault)]))
        return out
    ranks = [r for r in range(world) if r not in lost_ranks(fault)]
    chunks = [ranks[i::4 * workers] for i in range(4 * workers)]
    out: dict[int, bytes] = {}
    with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
        for part in pool.map(partial(_some_payloads, world, fault, t_end_ns), chunks):
            out.update(part)
    return out


def _some_summaries(payloads: dict[int, bytes], heard_ns: int, firsts: list[int]) -> list[tuple[int, bytes, tuple[int, ...], bool]]:
    from fr_otel.agent.incident.relay import summarise_node

    out = []
    for first in firsts:
        mine = {r: payloads[r] for r in node_of(first) if r in payloads}
        problems: list[str] = []
        blob, ranks, whole = summarise_node(host_of(first), first, mine, {r: heard_ns for r in mine}, problems)
        assert not problems, problems
        out.append((first, blob, ranks, whole))
    return out


def make_summaries(payloads: dict[int, bytes], heard_ns: int, workers: int = 2,
                   ) -> list[tuple[int, bytes, tuple[int, ...], bool]]:
    """Each node's summary as its leader makes it (the real ``summarise_node``): (first rank, blob, ranks,
    whole payloads included), for every node with a payload, by ``workers`` forked processes."""
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial
    from multiprocessing import get_context

    firsts = sorted({r - r % RANKS_PER_NODE for r in payloads})
    chunks = [firsts[i::4 * workers] for i in range(4 * workers)]
    out = []
    with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
        for part in pool.map(partial(_some_summaries, payloads, heard_ns), chunks):
            out.extend(part)
    return sorted(out)
