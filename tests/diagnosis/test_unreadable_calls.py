"""A call the reader could not read is unknown, not different: it never makes a healthy rank a mismatch culprit."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from fr_otel import analyze, build_job, read_dumps
from fr_otel.testing.dump_builder import DumpBuilder


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize(("field", "value"), [("input_dtypes", [None]), ("input_sizes", "x"),
                                              ("output_dtypes", 7), ("output_sizes", [[-1]])])
def test_an_unreadable_call_on_a_healthy_rank_is_never_blamed_as_a_mismatch(
        tmp_path: Path, fmt: str, field: str, value: object) -> None:
    """A repaired sizes/dtypes field reads as an unknown call: the healthy rank it sits on is not
    named for a mismatch, and the real culprit (rank 2, which never enqueued #6) still is."""
    b = DumpBuilder(4)
    world = b.group("0", "default_pg", range(4))
    for _ in range(5):
        b.collective(world)
    b.collective(world, ranks=[0, 1, 3], done=False)
    folder = b.write(tmp_path / fmt, fmt=fmt)
    victim = folder / "nccl_trace_rank_1"
    body = pickle.loads(victim.read_bytes()) if fmt == "pickle" else json.loads(victim.read_bytes())
    for entry in body["entries"][2:4]:  # two completed collectives of the healthy rank 1
        entry[field] = value
    victim.write_bytes(pickle.dumps(body, protocol=2) if fmt == "pickle" else json.dumps(body).encode())

    read = read_dumps(folder)
    verdict = analyze(build_job(read))
    assert any(str(victim) in p and field in p for p in read.problems)
    assert [c.rank for c in verdict.culprits] == [2] and verdict.verdict == "hang"
    assert all(c.kind != "mismatch" and all(ev.kind != "mismatch" for ev in c.related) for c in verdict.culprits)
