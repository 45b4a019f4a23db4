"""A small NCCL-shaped job to make hostile: plain dicts, as torch's recorder writes them."""

from __future__ import annotations

from typing import Any

__all__ = ["WORLD", "STUCK", "VICTIM", "T0", "nccl_dump"]

WORLD = 4
STUCK = 3  # never enqueues the last all_reduce: the verdict is a hang naming it
VICTIM = 1  # the rank whose dump is made hostile (a waiting rank)
T0 = 1_700_000_000_000_000_000


def nccl_dump(rank: int, n: int = 6) -> dict[str, Any]:
    """One rank of a small NCCL-shaped job: ``n`` all_reduces, rank STUCK misses the last."""
    last = n - 1 if rank == STUCK else n
    entries = []
    for i in range(1, last + 1):
        done = i < n
        start = T0 + i * 1_000_000 + rank * 1000
        entries.append({
            "record_id": i - 1, "pg_id": 0, "process_group": ("0", "default_pg"), "thread_name": "python",
            "thread_id": "140001", "collective_seq_id": i, "p2p_seq_id": 0, "op_id": i,
            "profiling_name": "nccl:all_reduce", "time_created_ns": start, "input_sizes": [[4, 4]],
            "input_dtypes": ["Float"], "output_sizes": [[4, 4]], "output_dtypes": ["Float"],
            "state": "completed" if done else "started", "time_discovered_started_ns": start + 10,
            "time_discovered_completed_ns": start + 500 if done else None, "retired": done,
            "timeout_ms": 600_000, "is_p2p": False, "duration_ms": 0.5 if done else None,
            "frames": [{"name": "train_step", "filename": "train.py", "line": 40 + i}],
        })
    return {
        "version": "2.10", "comm_lib_version": "2.21.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(WORLD)))}},
        "pg_status": {"0": {"last_enqueued_collective": last, "last_started_collective": last,
                            "last_completed_collective": min(last, n - 1)}},
        "entries": entries,
    }
