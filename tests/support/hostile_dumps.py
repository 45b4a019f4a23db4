"""A small NCCL-shaped job to make hostile: plain dicts, as torch's recorder writes them, the
folder they go to, and the CLI run on it as a user would."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["CLI", "STUCK", "T0", "VICTIM", "WORLD", "cli", "everything", "nccl_dump", "victim_with", "write_job"]

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


CLI = [sys.executable, "-m", "fr_otel.cli"]


def write_job(folder: Path, victim: dict[str, Any] | None = None, *, fmt: str = "pickle",
              name: str | bytes | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(WORLD):
        doc = victim if rank == VICTIM and victim is not None else nccl_dump(rank)
        data = pickle.dumps(doc) if fmt == "pickle" else json.dumps(doc).encode()
        file = f"rank_{rank}" + (".json" if fmt == "json" else "")
        if rank == VICTIM and name is not None:
            path = os.path.join(os.fsencode(folder), name) if isinstance(name, bytes) else str(folder / name)
            with open(path, "wb") as fh:
                fh.write(data)
        else:
            (folder / file).write_bytes(data)
    return folder


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FR_OTEL_"))}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})},
                          errors="backslashreplace")


def victim_with(**fields: Any) -> dict[str, Any]:
    """The victim rank's dump with these fields set in its last entry."""
    doc = nccl_dump(VICTIM)
    doc["entries"][-1].update(fields)
    return doc


def everything(folder: Path) -> tuple[Any, Any, list[str]]:
    """Read, model, analyse, render (text and page) and encode the job in ``folder``: (job, verdict, problems)."""
    from fr_otel import analyze, build_job, read_dumps
    from fr_otel.otlp.chunks import to_requests
    from fr_otel.report.html import render
    from fr_otel.report.text import render_verdict
    from fr_otel.trace.spans import build_trace

    read = read_dumps(folder)
    job = build_job(read)
    verdict = analyze(job)
    render_verdict(verdict)
    render(job, verdict)
    to_requests(build_trace(job, verdict).spans)
    return job, verdict, read.problems
