"""The failure verdict: a job its own code ended names the ranks that raised, never healthy or hang (no torch).

The live job (tests/live/test_causes.py: every rank raises at step 0) makes it real; these pin the rule on dumps
built with the recorder's shape and the exit records the agent leaves (``fr_otel_exit``).
"""

from __future__ import annotations

import pickle

from fr_otel import analyze, build_job
from fr_otel.diagnosis.verdict import AnalysisOptions, Verdict
from fr_otel.read.dump_file import parse_dump_bytes
from fr_otel.read.rank_facts import EXIT_KEY
from fr_otel.read.reader import ReadResult
from fr_otel.testing.dump_builder import DumpBuilder


def _verdict(hung: bool, exits: dict[int, dict[str, object]], options: AnalysisOptions | None = None) -> Verdict:
    """Four ranks after five all_reduces; ``hung``: ranks 0, 1, 3 wait in a sixth that rank 2 never enqueued."""
    b = DumpBuilder(4)
    for _ in range(5):
        b.collective(b.world)
    if hung:
        b.collective(b.world, ranks=[0, 1, 3], done=False)
    at = b.clock + 6 * 10**9
    read = ReadResult()
    for r in range(4):
        raw = b.dump(r)
        if r in exits:
            raw = pickle.dumps({**pickle.loads(raw), EXIT_KEY: exits[r]})
        read.dumps[r] = parse_dump_bytes(raw, r, f"rank_{r}", dumped_at_ns=at)  # type: ignore[assignment]
    return analyze(build_job(read), options or AnalysisOptions(raised_over_s=3.0))


def _raised(rank: int, at_ns: int) -> dict[str, object]:
    return {"how": "exception", "type": "RuntimeError", "message": f"rank {rank} found no batch",
            "where": "/job/train.py:12 in step", "at_ns": at_ns}


def test_every_rank_raising_with_nothing_in_flight_is_a_failure_naming_each_exception_the_first_first() -> None:
    """Recorders with nothing in flight would read healthy: the exit records say every rank raised."""
    found = _verdict(False, {r: _raised(r, 100 - r) for r in range(4)})
    assert found.verdict == "failure"
    assert [c.rank for c in found.culprits] == [3, 2, 1, 0]
    assert all(c.cause is not None and c.cause.cls == "crashed" for c in found.culprits)
    assert found.culprits[0].cause is not None and found.culprits[0].cause.evidence == (
        "uncaught RuntimeError: rank 3 found no batch at /job/train.py:12 in step",)
    assert _verdict(False, {}).verdict == "healthy"  # no exit record: the recorders alone decide


def test_a_culprit_that_raised_is_a_failure_once_every_rank_has_left_and_a_hang_while_its_peers_wait() -> None:
    """Rank 2 raised; its launcher then ended the others with SIGTERM: the job ended, so a failure naming rank 2
    alone. While its peers still wait (no record of their leaving), the job hangs on it."""
    ended = _verdict(True, {2: _raised(2, 5), **{r: {"how": "sigterm", "at_ns": 9} for r in (0, 1, 3)}})
    assert ended.verdict == "failure" and [c.rank for c in ended.culprits] == [2]
    waiting = _verdict(True, {2: _raised(2, 5)})
    assert waiting.verdict == "hang" and [c.rank for c in waiting.culprits] == [2]
    torn = _verdict(True, {2: {"how": "exit", "at_ns": 5}, **{r: {"how": "sigterm", "at_ns": 9} for r in (0, 1, 3)}})
    assert torn.verdict == "hang"  # nobody raised: a rank that left the loop early is a hang's culprit


def test_a_culprit_that_raised_is_a_failure_when_the_incident_came_as_the_job_ended() -> None:
    """Rank 2 raised and its excepthook raised the incident (the job is ending) while its peers still waited on it:
    a failure naming rank 2's exception, never a hang; a waiter that raised while rank 2 hangs leaves the hang."""
    ending = AnalysisOptions(raised_over_s=3.0, ending=True)
    crashed = _verdict(True, {2: _raised(2, 5)}, ending)
    assert crashed.verdict == "failure" and crashed.job_ended and [c.rank for c in crashed.culprits] == [2]
    assert crashed.culprits[0].cause is not None and crashed.culprits[0].cause.evidence == (
        "uncaught RuntimeError: rank 2 found no batch at /job/train.py:12 in step",)
    waiter = _verdict(True, {0: _raised(0, 5)}, ending)
    # Rank 0's own exception names it too (it faulted while it waited), after the rank its peers wait on.
    assert waiter.verdict == "hang" and [c.rank for c in waiter.culprits] == [2, 0]
