"""A rank whose recorder did not come is called stuck only if its agent was ever heard from: one that never ran an
agent (its launcher started none) is said to have no agent, never to be stuck."""

from __future__ import annotations

from fr_otel.agent.incident.gather import silent_ranks


def test_a_rank_never_heard_from_has_no_agent_and_is_not_called_stuck() -> None:
    """Rank 0 (never heard: Lightning's rank 0 before fr-otel followed it) has no agent; rank 3 (heard, then
    silent) is the one that may be stuck."""
    lines = silent_ranks([0, 3], known={1, 2, 3}, gather_s=30)
    assert lines == ["rank(s) 0: no agent (never heard from since the job started, so not known to be stuck; "
                     "fr-otel run, or fr_otel.start() at the top of the script, starts one)",
                     "rank(s) 3 sent no recorder within 30 s (stuck with the GIL held, cut off, or dead)"]


def test_every_rank_in_says_nothing() -> None:
    """No rank missing: no line."""
    assert silent_ranks([], known={0, 1}, gather_s=30) == []
