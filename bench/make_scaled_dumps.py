#!/usr/bin/env python3
"""Make a large, realistic Flight Recorder job for benchmarks: N ranks x M entries, one hang.

Step 1 (cached): record ONE real rank with torch. A 1-rank gloo job on CPU runs a
training-like mix of all_reduce / all_gather / broadcast on the world group and on a
subgroup (desc "tp"), with ``TORCH_FR_BUFFER_SIZE = M + 1``, more collectives than
that (so the ring has wrapped, as in any long job), and one final world all_reduce
from a separate call site. The recorder is pulled in-process with
``torch._C._distributed_c10d._dump_fr_trace(includeCollectives=True,
includeStackTraces=True, onlyActive=False)`` and the raw bytes are cached on disk
(torch runs in a child interpreter; this process never imports it).

Step 2 (cached): scale that recording to N ranks by rewriting it per rank:

* ``pg_config`` is made sound (gloo's own is empty in torch 2.13 and PyTorch's analyzer
  crashes on it): ``{name: {"name", "desc", "ranks": "[0, 1, ...]"}}``, ranks as the
  string torch writes, for the world group ("0", ``default_pg``) and the rank's own
  subgroup (groups "1".."k" of ``--group-size`` consecutive ranks, desc "tp");
* subgroup entries name the rank's own subgroup (local ``pg_id`` stays 1 everywhere,
  as a local slot does);
* ``time_created_ns`` gets a per-rank clock skew plus per-entry enqueue lateness
  (kept monotonic); ``thread_id`` differs per rank; file mtimes sit 10 min after the
  last enqueue, as if dumped on a watchdog timeout;
* the hang: every rank but one holds the last M recorded entries, the final world
  all_reduce in flight (``retired`` False; gloo never leaves ``scheduled``); the
  culprit (rank N//3 by default) stopped enqueuing before it and holds the M entries
  before that one, all retired. ``pg_status`` is consistent with each rank's entries.
* ``--p2p``: pipeline traffic as well. Ranks form pipelines of 4 stages (rank r is stage
  ``r // (N/4)`` of pipeline ``r % (N/4)``, a group of its own); every recorded tp
  all_reduce becomes a send to the next stage or a recv from the previous one (NCCL's
  ``send a->b`` / ``recv a<-b`` names, local ranks, ``is_p2p``, per-rank ``p2p_seq_id``,
  the group's ``pg_status`` on the p2p counter), all completed; the tp group's sequence
  numbers stay contiguous. Same entry count, same culprit.

Torch's key set, ``version`` ("2.10") and ``comm_lib_version`` are kept as recorded.
Files are ``pickle.dump(..., protocol=2)`` as ``OUT/<prefix><rank>``; ``OUT/.manifest.json``
is written last and says what the directory holds, so a complete directory is reused.

    python bench/make_scaled_dumps.py --ranks 1024 --entries 2000 --out /tmp/fr-otel-bench/r1024_e2000
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import pickle
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["generate", "ensure_dumps", "record", "DEFAULT_ROOT"]

DEFAULT_ROOT = Path("/tmp/fr-otel-bench")
FORMAT = 2  # bump when the generated content changes, to invalidate cached directories
RECORDING_FORMAT = 1  # bump when the recorded workload changes, to invalidate cached recordings
_WARMUP_OPS = 37  # recorded before the window: the ring has wrapped, seq ids do not start at 1
_DUMP_AFTER_S = 600  # file mtime: this long after the last enqueue (a watchdog-style dump)
_WORLD = ("0", "default_pg")
_SUB_DESC = "tp"
_GATHER_OPS = frozenset({"gloo:all_gather", "gloo:_allgather_base", "gloo:all_gather_into_tensor"})


# --------------------------------------------------------------------------- step 1: record


def _recording_workload(entries: int, out: str) -> None:
    """Runs in a child interpreter: one real gloo rank, dumped in-process."""
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(entries + 1)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tp = dist.new_group([0], group_desc=_SUB_DESC)
    grads = torch.ones(1024)
    acts = torch.ones(64, 16, dtype=torch.bfloat16)
    gathered = [torch.empty(64, 16, dtype=torch.bfloat16)]
    flag = torch.zeros(4, dtype=torch.int64)
    loss = torch.ones(1)

    def tp_gather_activations() -> None:
        dist.all_gather(gathered, acts, group=tp)

    def tp_reduce_activations() -> None:
        dist.all_reduce(acts, group=tp)

    def dp_reduce_gradients() -> None:
        dist.all_reduce(grads)

    def broadcast_flags() -> None:
        dist.broadcast(flag, src=0)

    def log_loss() -> None:
        dist.all_reduce(loss)

    step = (tp_gather_activations, tp_reduce_activations, dp_reduce_gradients, broadcast_flags, log_loss)
    # The final all_reduce below makes it entries + 1 in the window.
    for i in range(_WARMUP_OPS + entries):
        step[i % len(step)]()

    def sync_before_checkpoint() -> None:  # the collective the culprit never reaches
        dist.all_reduce(loss)

    sync_before_checkpoint()
    raw = torch._C._distributed_c10d._dump_fr_trace(
        includeCollectives=True, includeStackTraces=True, onlyActive=False
    )
    dump = pickle.loads(raw)
    got = len(dump.get("entries", []))
    if got != entries + 1:
        raise SystemExit(f"recorded {got} entries, expected {entries + 1}")
    if tuple(dump["entries"][-1]["process_group"]) != _WORLD:
        raise SystemExit("last recorded collective is not on the world group")
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(raw)
    os.replace(tmp, out)
    dist.destroy_process_group()


def record(entries: int, cache_dir: Path, python: str = sys.executable) -> Path:
    """The cached recording of one real rank with ``entries + 1`` entries (made if absent)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"gloo_1rank_fmt{RECORDING_FORMAT}_e{entries}.pkl"
    if path.is_file():
        return path
    t0 = time.perf_counter()
    proc = subprocess.run(
        [python, os.path.abspath(__file__), "--_record", str(path), "--entries", str(entries)],
        capture_output=True, text=True,
    )
    if proc.returncode != 0 or not path.is_file():
        raise RuntimeError(f"recording failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    print(f"recorded 1 real gloo rank, {entries + 1} entries, in {time.perf_counter() - t0:.1f} s -> {path}",
          file=sys.stderr)
    return path


# --------------------------------------------------------------------------- step 2: scale

_G: dict[str, Any] = {}  # per-process state for the pool (inherited on fork, set in init otherwise)


def _init_worker(state: dict[str, Any]) -> None:
    _G.update(state)


def _ranks_text(ranks: range) -> str:
    return str(list(ranks))  # "[0, 1, 2]", as torch writes it


_PP_STAGES = 4
_PP_DESC = "PIPELINE_MODEL_PARALLEL_GROUP"
_P2P_MARK = "p2p"  # process-group name of a recorded entry turned into a send/recv (rewritten per rank)


def _with_p2p(base: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every tp all_reduce becomes a p2p placeholder; tp sequence numbers are made contiguous again."""
    out = []
    seq: dict[str, int] = {}
    first: dict[str, int] = {}
    for e in base:
        name = e["process_group"][0]
        if name != _WORLD[0] and e["profiling_name"] == "gloo:all_reduce":
            out.append(dict(e, process_group=(_P2P_MARK, _PP_DESC), is_p2p=True))
            continue
        if name != _WORLD[0]:
            first.setdefault(name, e["collective_seq_id"])
            seq[name] = seq.get(name, first[name] - 1) + 1
            e = dict(e, collective_seq_id=seq[name], op_id=seq[name])
        out.append(e)
    return out


def _pipeline(rank: int, n: int) -> tuple[str, tuple[int, ...], int] | None:
    """(group name, members, this rank's stage) of the rank's pipeline, or None if too few ranks."""
    width = n // _PP_STAGES
    if width < 1 or rank >= width * _PP_STAGES:
        return None
    j = rank % width
    return f"pp{j}", tuple(j + s * width for s in range(_PP_STAGES)), rank // width


def _rank_dump(rank: int) -> dict[str, Any]:
    g = _G
    base: list[dict[str, Any]] = g["base"]
    n, size, culprit, seed = g["ranks"], g["group_size"], g["culprit"], g["seed"]
    rng = random.Random(seed * 1_000_003 + rank)
    sub_index = rank // size
    sub_name = str(1 + sub_index)
    sub_pg = (sub_name, _SUB_DESC)
    lo = sub_index * size
    sub_members = min(lo + size, n) - lo
    gathers = _GATHER_OPS
    window = base[:-1] if rank == culprit else base[1:]
    skew = int(rng.gauss(0, 300_000))  # clock skew between hosts: ~0.3 ms
    thread_id = str(rng.randrange(1 << 46, 1 << 47))  # what pthread_self() looks like
    expo = rng.expovariate
    entries = []
    prev = 0
    world_name = _WORLD[0]
    pipe = _pipeline(rank, n) if g.get("p2p") else None
    p2p_seq = 0
    for e in window:
        if e["process_group"][0] == _P2P_MARK:
            if pipe is None:
                continue
            name, members, stage = pipe
            p2p_seq += 1
            send = (p2p_seq % 2 == 1 and stage < _PP_STAGES - 1) or stage == 0
            label = f"send {stage}->{stage + 1}" if send else f"recv {stage}<-{stage - 1}"
            t = max(e["time_created_ns"] + skew, prev + 1)
            prev = t
            entries.append(dict(e, process_group=(name, _PP_DESC), pg_id=2, profiling_name=f"gloo:{label}",
                                collective_seq_id=0, p2p_seq_id=p2p_seq, time_created_ns=t, thread_id=thread_id))
            continue
        d = e.copy()
        t = e["time_created_ns"] + skew + int(expo(1 / 20_000))  # mean 20 us enqueue lateness
        if t <= prev:
            t = prev + 1
        d["time_created_ns"] = prev = t
        d["thread_id"] = thread_id
        if e["process_group"][0] != world_name:
            d["process_group"] = sub_pg
            members = sub_members
        else:
            members = n
        if e["profiling_name"] in gathers:
            # Recorded with 1 rank: the gathered output's leading dim is the group size.
            d["output_sizes"] = [[members, *s[1:]] for s in e["output_sizes"]]
        entries.append(d)
    if rank != culprit:
        entries[-1]["retired"] = False  # in flight: entered, never finished
    status: dict[str, dict[str, int]] = {}
    for d in entries:  # pg_status from the entries: last enqueued / completed per local id
        st = status.setdefault(str(d["pg_id"]), {
            "last_enqueued_collective": -1, "last_started_collective": -1, "last_completed_collective": -1,
        })
        counter = d["p2p_seq_id"] if d.get("is_p2p") else d["collective_seq_id"]  # as NCCL counts p2p groups
        st["last_enqueued_collective"] = counter
        if d["retired"]:
            st["last_completed_collective"] = counter
    pg_config = {
        world_name: {"name": world_name, "desc": _WORLD[1], "ranks": g["world_ranks"]},
        sub_name: {"name": sub_name, "desc": _SUB_DESC, "ranks": _ranks_text(range(lo, min(lo + size, n)))},
    }
    if pipe is not None:
        pg_config[pipe[0]] = {"name": pipe[0], "desc": _PP_DESC, "ranks": str(list(pipe[1]))}
    out: dict[str, Any] = {}
    for key in g["key_order"]:  # torch's top-level key order and set
        if key == "pg_config":
            out[key] = pg_config
        elif key == "pg_status":
            out[key] = status
        elif key == "entries":
            out[key] = entries
        else:
            out[key] = g["top"][key]
    return out


def _write_rank(rank: int) -> int:
    g = _G
    path = os.path.join(g["out"], f"{g['prefix']}{rank}")
    dump = _rank_dump(rank)
    tmp = f"{path}.part"
    with open(tmp, "wb") as fh:
        pickle.dump(dump, fh, protocol=2)
    os.replace(tmp, path)
    mtime = g["last_ns"] + _DUMP_AFTER_S * 10**9 + rank * 1_000_000
    os.utime(path, ns=(mtime, mtime))
    return os.path.getsize(path)


def _manifest_wanted(ranks: int, entries: int, prefix: str, group_size: int, culprit: int, seed: int,
                     p2p: bool = False) -> dict:
    return {
        "format": FORMAT, "ranks": ranks, "entries": entries, "prefix": prefix,
        "group_size": group_size, "culprit": culprit, "seed": seed, "p2p": p2p,
    }


def read_manifest(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / ".manifest.json").read_text())
    except (OSError, ValueError):
        return None


def _complete(out: Path, wanted: dict[str, Any]) -> dict[str, Any] | None:
    man = read_manifest(out)
    if not man or any(man.get(k) != v for k, v in wanted.items()):
        return None
    for r in range(wanted["ranks"]):
        if not (out / f"{wanted['prefix']}{r}").is_file():
            return None
    return man


def generate(
    ranks: int, entries: int, out: Path, *, prefix: str = "rank_", group_size: int = 8,
    culprit: int | None = None, seed: int = 0, workers: int | None = None,
    cache_dir: Path = DEFAULT_ROOT / "recordings", force: bool = False, python: str = sys.executable,
    p2p: bool = False,
) -> dict[str, Any]:
    """Make (or reuse) ``out`` with ``ranks`` dumps of ``entries`` entries; returns the manifest."""
    if ranks < 2 or entries < 2:
        raise ValueError("need at least 2 ranks and 2 entries")
    culprit = ranks // 3 if culprit is None else culprit
    if not 0 <= culprit < ranks:
        raise ValueError(f"culprit {culprit} is not a rank of {ranks}")
    group_size = max(1, min(group_size, ranks))
    out = Path(out)
    wanted = _manifest_wanted(ranks, entries, prefix, group_size, culprit, seed, p2p)
    if not force:
        man = _complete(out, wanted)
        if man is not None:
            return man
    rec_path = record(entries, Path(cache_dir), python=python)
    with open(rec_path, "rb") as fh:
        rec = pickle.load(fh)
    # Every recorded collective finished (1 rank); say so explicitly, then unfinish per rank.
    base = [e if e.get("retired") is True else dict(e, retired=True) for e in rec["entries"]]
    if p2p:
        base = _with_p2p(base)
    out.mkdir(parents=True, exist_ok=True)
    try:
        (out / ".manifest.json").unlink()
    except FileNotFoundError:
        pass
    stale = re.compile(re.escape(prefix) + r"(\d+)(\.part)?$")
    for p in out.iterdir():  # files of an earlier, larger job under the same prefix
        m = stale.match(p.name)
        if m and (m.group(2) or int(m.group(1)) >= ranks):
            p.unlink()
    state = {
        "base": base, "ranks": ranks, "group_size": group_size, "culprit": culprit, "seed": seed,
        "world_ranks": _ranks_text(range(ranks)), "out": str(out), "prefix": prefix,
        "key_order": list(rec.keys()), "top": {k: v for k, v in rec.items() if k != "entries"},
        "last_ns": max(e["time_created_ns"] for e in base),
        "p2p": p2p,
    }
    n_workers = max(1, min(workers or os.cpu_count() or 1, ranks))
    t0 = time.perf_counter()
    if n_workers == 1:
        _init_worker(state)
        sizes = [_write_rank(r) for r in range(ranks)]
    else:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        chunk = max(1, math.ceil(ranks / (n_workers * 8)))
        with ctx.Pool(n_workers, initializer=_init_worker, initargs=(state,)) as pool:
            sizes = pool.map(_write_rank, range(ranks), chunksize=chunk)
    elapsed = time.perf_counter() - t0
    sub = next((e["process_group"] for e in base if e["process_group"][0] != _WORLD[0]), None)
    manifest = dict(
        wanted,
        world_group=_WORLD[0],
        subgroups=math.ceil(ranks / group_size),
        hang={"group": _WORLD[0], "desc": _WORLD[1],
              "collective_seq_id": base[-1]["collective_seq_id"], "op": base[-1]["profiling_name"]},
        recording={"path": str(rec_path), "torch_version": rec.get("version"), "subgroup_recorded_as": list(sub) if sub else None},
        files=ranks, total_bytes=sum(sizes), generate_s=round(elapsed, 2),
        description=(f"{ranks} ranks x {entries} entries scaled from one real gloo rank; rank {culprit} "
                     f"stopped before world all_reduce seq {base[-1]['collective_seq_id']}, all others "
                     "have it in flight"),
    )
    tmp = out / ".manifest.json.part"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out / ".manifest.json")
    print(f"wrote {ranks} dumps x {entries} entries ({sum(sizes) / 2**20:.1f} MiB) in {elapsed:.1f} s "
          f"with {n_workers} worker(s) -> {out}", file=sys.stderr)
    return manifest


def default_out(ranks: int, entries: int, root: Path = DEFAULT_ROOT, p2p: bool = False) -> Path:
    return root / f"r{ranks}_e{entries}{'_p2p' if p2p else ''}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000, help="entries per rank's dump (the ring size)")
    ap.add_argument("--out", type=Path, default=None, help=f"default: {DEFAULT_ROOT}/r<ranks>_e<entries>")
    ap.add_argument("--prefix", default="rank_", help="file name prefix (default: %(default)s)")
    ap.add_argument("--group-size", type=int, default=8, help="subgroup (tp) size (default: %(default)s)")
    ap.add_argument("--culprit", type=int, default=None, help="the rank that hangs (default: ranks//3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None, help="processes to write with (default: all cores)")
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_ROOT / "recordings")
    ap.add_argument("--force", action="store_true", help="regenerate even if OUT is complete")
    ap.add_argument("--p2p", action="store_true", help="add pipeline send/recv (4 stages; see above)")
    ap.add_argument("--_record", dest="record_to", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.record_to:
        _recording_workload(args.entries, args.record_to)
        return 0
    out = args.out or default_out(args.ranks, args.entries, p2p=args.p2p)
    man = generate(
        args.ranks, args.entries, out, prefix=args.prefix, group_size=args.group_size, culprit=args.culprit,
        seed=args.seed, workers=args.workers, cache_dir=args.cache_dir, force=args.force, p2p=args.p2p,
    )
    print(json.dumps({k: man[k] for k in ("ranks", "entries", "culprit", "total_bytes", "hang")}))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
