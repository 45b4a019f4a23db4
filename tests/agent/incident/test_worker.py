"""One rank's incident work runs on one worker thread, by priority, from a bounded queue: a flood of work is
dropped past the bound with one log line, never held in memory or waited for."""

from __future__ import annotations

import logging
import threading

import pytest

from fr_otel.agent.incident.worker import MAX_PENDING, IncidentQueue


def test_the_raisers_own_work_goes_before_joins_queued_ahead_of_it() -> None:
    """Priority 0 (this rank's own incident) runs before priority 1 (joins) queued earlier, each in order."""
    work, gate, ran = IncidentQueue(), threading.Event(), []
    work.put(lambda: gate.wait(10), 1)  # the worker is busy while the rest is queued
    for name, priority in (("join a", 1), ("join b", 1), ("own", 0)):
        work.put(lambda name=name: ran.append(name), priority)
    gate.set()
    assert work.wait_idle(10) and ran == ["own", "join a", "join b"]
    work.stop(5)


def test_past_the_bound_joins_are_dropped_with_one_line_and_the_ranks_own_incident_never(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fr_otel.agent")
    work, gate, ran = IncidentQueue(), threading.Event(), []
    events = [work.put(lambda: gate.wait(10), 1)]
    events += [work.put(lambda i=i: ran.append(i), 1) for i in range(MAX_PENDING - 1)]
    dropped = [work.put(lambda: ran.append("dropped"), 1) for _ in range(3)]
    own = work.put(lambda: ran.append("own"), 0)  # this rank's own incident: never dropped
    assert all(e.is_set() for e in dropped) and not any(e.is_set() for e in [*events[1:], own])
    said = [r.getMessage() for r in caplog.records if "incident work are pending" in r.getMessage()]
    assert len(said) == 1, said
    gate.set()
    assert work.wait_idle(10) and ran == ["own", *range(MAX_PENDING - 1)]
    work.put(lambda: ran.append("after"), 1)  # room again once the queue drained
    assert work.wait_idle(10) and ran[-1] == "after"
    work.stop(5)
