"""One rule for when an op ends and one reference "now", shared by the trace and the HTML report."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fr_otel import analyze, build_job, read_dumps
from fr_otel.diagnosis.verdict import reference_ns
from fr_otel.read.dump import MAX_ESTIMATED_END_NS, OpInterval, op_interval
from fr_otel.report.facts import Facts
from fr_otel.report.lanes import lanes_for
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
    before = op_interval(10 * S, True, 50 * S, completed_ns=9 * S, next_created_ns=10 * S + S // 2)
    assert before == (10 * S, 10 * S + S // 2, True, False)


def test_without_a_completion_time_the_duration_then_the_next_enqueue_estimate_the_end() -> None:
    """A recorded duration comes first; gloo records neither, so the rank's next enqueue ends the op."""
    timed = op_interval(10 * S, True, 50 * S, duration_ms=250.0, next_created_ns=20 * S)
    assert timed == (10 * S, 10 * S + S // 4, True, False)
    assert op_interval(10 * S, True, 50 * S, next_created_ns=10 * S + S // 2) == (10 * S, 10 * S + S // 2, True, False)


def test_a_guessed_end_is_the_earliest_of_the_next_enqueues_the_reference_time_and_the_cap() -> None:
    """Gloo's completed op ends at the rank's or the group's next enqueue, the reference time, or
    MAX_ESTIMATED_END_NS after its start, whichever comes first; never before its enqueue."""
    assert op_interval(10 * S, True, 50 * S, next_created_ns=40 * S) == (10 * S, 10 * S + MAX_ESTIMATED_END_NS, True, False)
    assert op_interval(10 * S, True, 50 * S) == (10 * S, 10 * S + MAX_ESTIMATED_END_NS, True, False)
    assert op_interval(10 * S, True, 10 * S + 5) == (10 * S, 10 * S + 5, True, False)
    group_first = op_interval(10 * S, True, 50 * S, next_created_ns=10 * S + 900, group_next_ns=10 * S + 300)
    assert group_first.end == 10 * S + 300
    assert op_interval(10 * S, True, 50 * S, group_next_ns=9 * S).end == 10 * S


def test_the_group_bound_is_looked_up_only_for_a_guessed_end() -> None:
    """A recorded completion (or an op in flight) never pays for the look across ranks."""
    def never() -> int:
        raise AssertionError("looked up")
    assert op_interval(10 * S, True, 50 * S, completed_ns=12 * S, group_next_ns=never).end == 12 * S
    assert op_interval(10 * S, False, 50 * S, group_next_ns=never).end == 50 * S
    assert op_interval(10 * S, True, 50 * S, group_next_ns=lambda: 10 * S + 7).end == 10 * S + 7


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


def test_a_bar_in_the_report_and_its_span_in_the_trace_end_at_the_same_time(tmp_path: Path) -> None:
    """Gloo ops followed by 30 s of compute, then a hang: every op's report bar ends where its
    trace span ends, and no completed op is drawn across the compute."""
    b = DumpBuilder(4, backend="gloo")
    for _ in range(3):
        b.collective(b.world)
        b.clock += 30 * S  # compute between collectives: nothing recorded
    b.collective(b.world)
    b.collective(b.world, ranks=[0, 1, 2], done=False)  # rank 3 computes on, the others wait in #5
    job = build_job(read_dumps(str(b.write(tmp_path / "dumps"))))
    verdict = analyze(job)
    lanes = lanes_for(Facts.of(job, verdict))
    assert lanes is not None
    bars = {(int(lane.label.split()[-1]), bar.group, bar.seq): bar for lane in lanes[1] for bar in lane.bars
            if bar.kind != "ghost"}
    spans = {(s.attributes[A.RANK], s.attributes[A.PG_NAME], s.attributes[A.SEQ_ID]): s
             for s in build_trace(job, verdict, TraceOptions(job_id="ends")).spans
             if s.attributes and s.attributes.get(A.SPAN_ROLE) == "entry"}
    assert len(bars) == len(spans) == 4 * 4 + 3
    for key, bar in bars.items():
        span = spans[key]
        assert (bar.start, bar.end) == (span.start_time, span.end_time), key
        assert (bar.kind == "est") == bool(span.attributes.get(A.END_ESTIMATED)), key
        assert (bar.kind == "open") == (span.attributes[A.COMPLETED] is False), key
    done = [bar for bar in bars.values() if bar.kind == "est"]
    assert done and max(bar.end - bar.start for bar in done) <= MAX_ESTIMATED_END_NS
    # Rank 3 enqueued nothing after #4: the others' enqueue of #5 bounds its end, not the cap.
    assert bars[(3, "0", 4)].end == bars[(0, "0", 5)].start < bars[(3, "0", 4)].start + MAX_ESTIMATED_END_NS
