"""Every faulted rank named: a rank whose own process stopped or died while it waited is a culprit beside the rank
its peers wait on, after it; waiters stay waiters (no torch).

The live job (tests/live/test_causes.py: one rank busy, another SIGSTOPped a second later) makes it real; these pin
the rule on dumps built with the recorder's shape and the host views the agent sends (``fr_otel_host_view``).
"""

from __future__ import annotations

import pickle

from fr_otel import analyze, build_job
from fr_otel.diagnosis.verdict import AnalysisOptions, Verdict
from fr_otel.read.dump_file import parse_dump_bytes
from fr_otel.read.rank_facts import HOST_VIEW_KEY
from fr_otel.read.reader import ReadResult
from fr_otel.testing.dump_builder import DumpBuilder


def _verdict(state_of_1: str, with_dump_1: bool = False) -> Verdict:
    """Ranks 0, 1, 3 wait in a sixth all_reduce rank 2 never enqueued; rank 0's host view says rank 1 is in
    ``state_of_1``; rank 1's recorder is absent unless ``with_dump_1``."""
    b = DumpBuilder(4)
    for _ in range(5):
        b.collective(b.world)
    b.collective(b.world, ranks=[0, 1, 3], done=False)
    at = b.clock + 6 * 10**9
    read = ReadResult()
    view = {"1": {"pid": 11, "state": state_of_1, "seen_by": 0, "sampled_ns": at}}
    for r in (0, 1, 2, 3):
        if r == 1 and not with_dump_1:
            continue
        raw = b.dump(r)
        if r == 0:
            raw = pickle.dumps({**pickle.loads(raw), HOST_VIEW_KEY: view})
        read.dumps[r] = parse_dump_bytes(raw, r, f"rank_{r}", dumped_at_ns=at)  # type: ignore[assignment]
    return analyze(build_job(read), AnalysisOptions(raised_over_s=3.0))


def test_a_rank_stopped_while_it_waited_is_named_after_the_rank_its_peers_wait_on() -> None:
    """SIGSTOPped in its wait (its agent silent, no recorder): a culprit, stopped, second; not explained away."""
    found = _verdict("T")
    assert found.verdict == "hang"
    assert [(c.rank, c.cause.cls if c.cause else None) for c in found.culprits] == [(2, "unknown"), (1, "stopped")]
    assert found.culprits[1].blamed


def test_a_rank_that_only_waits_stays_a_waiter_and_a_stopped_waiter_with_a_recorder_is_named_too() -> None:
    """Asleep in its wait, it is no culprit of its own; stopped there with its recorder read, it is."""
    asleep = _verdict("S", with_dump_1=True)
    assert [c.rank for c in asleep.culprits] == [2]
    stopped = _verdict("T", with_dump_1=True)
    assert [(c.rank, c.kind) for c in stopped.culprits] == [(2, "not_enqueued"), (1, "not_completed")]
    assert stopped.culprits[1].cause is not None and stopped.culprits[1].cause.cls == "stopped"
