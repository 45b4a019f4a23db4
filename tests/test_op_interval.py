"""One rule for when an op ends and one reference "now", shared by the trace and the HTML report."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fr_otel import analyze, build_job, read_dumps
from fr_otel.diagnosis.verdict import reference_ns
from fr_otel.read.dump import OpInterval, op_interval
from fr_otel.report.facts import Facts
from fr_otel.testing.dump_builder import DumpBuilder
from fr_otel.trace import attributes as A
from fr_otel.trace.spans import TraceOptions, build_trace

S = 1_000_000_000


def test_an_op_in_flight_runs_to_the_reference_time_never_before_its_enqueue() -> None:
    """Never completed: open-ended, up to the reference time (or its own enqueue if that is later)."""
    assert op_interval(10 * S, False, 50 * S) == OpInterval(10 * S, 50 * S, False, True)
    assert op_interval(60 * S, False, 50 * S) == OpInterval(60 * S, 60 * S, False, True)


def test_a_recorded_completion_time_ends_the_op_unless_it_precedes_the_enqueue() -> None:
    """NCCL's completion time is the end; one before the enqueue is not trusted and the end is estimated."""
    recorded = op_interval(10 * S, True, 50 * S, completed_ns=12 * S, next_created_ns=20 * S)
    assert recorded == (10 * S, 12 * S, False, False)
    before = op_interval(10 * S, True, 50 * S, completed_ns=9 * S, next_created_ns=20 * S)
    assert before == (10 * S, 20 * S, True, False)


def test_without_a_completion_time_the_duration_then_the_next_enqueue_estimate_the_end() -> None:
    """A recorded duration comes first; gloo records neither, so the rank's next enqueue ends the op."""
    timed = op_interval(10 * S, True, 50 * S, duration_ms=250.0, next_created_ns=20 * S)
    assert timed == (10 * S, 10 * S + S // 4, True, False)
    assert op_interval(10 * S, True, 50 * S, next_created_ns=20 * S) == (10 * S, 20 * S, True, False)


def test_a_guessed_end_is_bounded_and_an_unknown_one_is_the_callers_choice() -> None:
    """The trace bounds a guessed end and falls back to "now"; the report sizes a zero-length op itself."""
    capped = op_interval(10 * S, True, 50 * S, next_created_ns=40 * S, max_estimate_ns=S)
    assert capped == (10 * S, 11 * S, True, False)
    assert op_interval(10 * S, True, 50 * S, otherwise_ns=50 * S, max_estimate_ns=S).end == 11 * S
    assert op_interval(10 * S, True, 50 * S).end == 10 * S


def hung_job(tmp_path: Path, backend: str = "gloo") -> Path:
    """Four ranks, a few completed collectives, then rank 3 never enqueues the next one."""
    b = DumpBuilder(4, backend=backend)
    for _ in range(4):
        b.collective(b.world)
    b.collective(b.world, ranks=[0, 1, 2], done=False)
    return b.write(tmp_path / "dumps")


def test_the_report_and_the_trace_measure_ages_to_the_same_reference_time(tmp_path: Path) -> None:
    """With the verdict's reference time, or without one (a verdict made elsewhere), both use the same "now"."""
    job = build_job(read_dumps(str(hung_job(tmp_path))))
    verdict = analyze(job)
    assert reference_ns(verdict, job) == verdict.reference_ns == Facts.of(job, verdict).ref
    bare = dataclasses.replace(verdict, reference_ns=None)
    assert reference_ns(bare, job) == job.latest_ns > 0
    assert Facts.of(job, bare).ref == job.latest_ns
    trace = build_trace(job, bare, TraceOptions(job_id="ref-test"))
    in_flight = [s for s in trace.spans if s.attributes and s.attributes.get(A.SPAN_ROLE) == "entry"
                 and s.attributes.get(A.COMPLETED) is False]
    assert in_flight and all(s.end_time == job.latest_ns for s in in_flight)
