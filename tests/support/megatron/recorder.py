"""What each rank's Flight Recorder holds when its dump is pulled: real-format NCCL dumps.

The layout is torch 2.13's (version "2.10", ``comm_lib_version``): ``pg_config`` by group name
with the members as a string, ``pg_status`` by the rank's local slot (string keys, as pickled
by torch), the ring of entries oldest first. An op counts as completed once the NCCL watchdog
has noticed it: it sweeps every ``watchdog_s`` (100 ms in torch), so completion is seen late,
in batches, by design. Counters continue a job that ran long before the simulated steps (no
ring starts at record id 0), and the ring keeps only the newest ``capacity`` entries.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

from .engine import INF, Record, Run

__all__ = ["T0_NS", "dump_bytes", "dump_dict", "ns", "seq_offset"]

T0_NS = 1_764_000_000 * 10**9  # the simulated job's second 0 (2025-11-24 16:00 UTC)
_TIMEOUT_MS = 600_000
_STEPS_BEFORE = 3000  # the job ran this many steps before the simulated ones
_FRAMES = {
    "tp_fwd": ("forward", "megatron/core/tensor_parallel/mappings.py", 221),
    "tp_bwd": ("backward", "megatron/core/tensor_parallel/mappings.py", 236),
    "get_batch": ("broadcast_data", "megatron/core/tensor_parallel/data.py", 96),
    "p2p_fwd": ("_communicate", "megatron/core/pipeline_parallel/p2p_communication.py", 338),
    "p2p_bwd": ("_communicate", "megatron/core/pipeline_parallel/p2p_communication.py", 338),
    "dp_rs": ("start_grad_sync", "megatron/core/distributed/param_and_grad_buffer.py", 412),
    "dp_ag": ("start_param_sync", "megatron/core/distributed/param_and_grad_buffer.py", 362),
    "emb": ("_allreduce_embedding_grads", "megatron/core/distributed/finalize_model_grads.py", 140),
    "grad_norm": ("get_grad_norm_fp32", "megatron/core/optimizer/clip_grads.py", 121),
}


def ns(seconds: float) -> int:
    """Simulated seconds as epoch nanoseconds."""
    return T0_NS + int(round(seconds * 1e9))


def _seen_at(rank: int, done_at: float, watchdog_s: float) -> float:
    """When the watchdog's sweep noticed a completion (its phase differs per rank)."""
    if done_at == INF:
        return INF
    phase = (rank * 0.037) % watchdog_s
    return phase + math.ceil((done_at - phase) / watchdog_s) * watchdog_s


_STACKS: dict[str, list[dict[str, Any]]] = {}


def _frames(rec: Record) -> list[dict[str, Any]]:
    """The Python stack that issued the op, innermost first (one shared list per call site)."""
    stack = _STACKS.get(rec.tag)
    if stack is None:
        stack = _STACKS[rec.tag] = _stack(rec.tag)
    return stack


def _stack(tag: str) -> list[dict[str, Any]]:
    name, path, line = _FRAMES.get(tag, ("train_step", "megatron/training/training.py", 1120))
    return [
        {"name": "wrapper", "filename": "/usr/lib/python3/dist-packages/torch/distributed/c10d_logger.py", "line": 81},
        {"name": name, "filename": f"/workspace/{path}", "line": line},
        {"name": "train_step", "filename": "/workspace/megatron/training/training.py", "line": 1120},
        {"name": "pretrain", "filename": "/workspace/megatron/training/training.py", "line": 720},
    ]


def _entry(run: Run, rank: int, rid: int, rec: Record, slot: dict[str, int], at: float,
           watchdog_s: float) -> dict[str, Any]:
    g = rec.group
    seen = _seen_at(rank, rec.done_at, watchdog_s)
    done = seen <= at
    seq = rec.seq + seq_offset(g.desc)
    p2p = rec.p2p_seq + _p2p_offset(rank) if rec.is_p2p else 0
    shapes = [list(s) for s in rec.sizes]
    return {
        "record_id": rid + 90_000 + 17 * rank,
        "pg_id": slot[g.name],
        "process_group": (g.name, g.desc),
        "collective_seq_id": seq,
        "p2p_seq_id": p2p,
        "op_id": seq + (rec.p2p_seq if rec.is_p2p else 0),
        "profiling_name": f"nccl:{rec.op}",
        "time_created_ns": ns(rec.created),
        "input_sizes": shapes,
        "input_dtypes": [rec.dtype] * len(shapes),
        "output_sizes": shapes,
        "output_dtypes": [rec.dtype] * len(shapes),
        "state": "completed" if done else "scheduled",
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": ns(seen) if done else None,
        "retired": done,
        "timeout_ms": _TIMEOUT_MS,
        "is_p2p": rec.is_p2p,
        "thread_name": "pt_autograd_0" if rec.tag.endswith("_bwd") else "pt_main_thread",
        "thread_id": str(140_000_000 + rank),
        "frames": _frames(rec),
    }


def dump_dict(run: Run, rank: int, at: float, *, capacity: int = 2000, only_active: bool = False,
              watchdog_s: float = 0.1) -> dict[str, Any]:
    """Rank ``rank``'s recorder as pulled at simulated second ``at``."""
    layout = run.layout
    mine = layout.member_of(rank)
    slot = {g.name: i for i, g in enumerate(mine)}
    records = [rec for rec in run.records[rank] if rec.created <= at]
    first = max(0, len(records) - capacity)
    entries = [_entry(run, rank, i, rec, slot, at, watchdog_s) for i, rec in enumerate(records[first:], first)]
    enqueued: dict[tuple[str, bool], int] = {}  # (group, p2p) -> last counter enqueued
    completed: dict[tuple[str, bool], int] = {}  # ... -> last counter the watchdog saw complete
    for rec in records:
        key = (rec.group.name, rec.is_p2p)
        n = rec.p2p_seq if rec.is_p2p else rec.seq
        enqueued[key] = n
        if _seen_at(rank, rec.done_at, watchdog_s) <= at and n > completed.get(key, 0):
            completed[key] = n
    status: dict[str, dict[str, int]] = {}
    for g in mine:
        p2p = (g.name, True) in enqueued  # NCCL tracks the p2p counter in a group that carries send/recv
        key = (g.name, p2p)
        offset = _p2p_offset(rank) if p2p else seq_offset(g.desc)
        if key in enqueued:
            last, done = enqueued[key] + offset, completed.get(key, 0) + offset
        else:
            last = done = -1
        status[str(slot[g.name])] = {"last_enqueued_collective": last, "last_started_collective": -1,
                                     "last_completed_collective": done}
    if only_active:
        entries = [e for e in entries if not e["retired"]]
    config = {g.name: {"name": g.name, "desc": g.desc, "ranks": str(list(g.ranks))}
              for g in [layout.groups[0], *mine]}
    return {"version": "2.10", "comm_lib_version": "2.21.5", "pg_config": config, "pg_status": status,
            "entries": entries}


def seq_offset(desc: str) -> int:
    """Collectives the group ran before the simulated steps: the same on every member, and on
    every group of a kind (parallel groups run the same program)."""
    return _STEPS_BEFORE * (sum(map(ord, desc)) % 7 + 1)


def _p2p_offset(rank: int) -> int:
    """Send/recv the rank ran before (p2p counters are per rank: never comparable across ranks)."""
    return 7000 + 131 * rank


def dump_bytes(run: Run, rank: int, at: float, **kw: Any) -> bytes:
    return pickle.dumps(dump_dict(run, rank, at, **kw), protocol=4)
