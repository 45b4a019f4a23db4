"""One event, one incident number: a rank whose collective fails as a peer crashes joins the incident another
rank raised for that crash, even when its poll thread joins it between the failure and its own flush (seen on
a loaded 3-host lab: two ranks' "Connection closed by peer" became incidents 1 and 2). Real TCPStore on loopback."""

from __future__ import annotations

import dataclasses
import pickle
import threading
import time
from pathlib import Path

import pytest

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from support.node_ranks import flat_rank

from fr_otel.agent.incident import memory as incident_memory
from fr_otel.agent.incident.runner import IncidentRunner
from fr_otel.agent.observe.poller import ProgressTracker, Stall
from fr_otel.agent.observe.state import GroupStatus
from fr_otel.incident.trigger import Trigger

CRASH = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:1955")


def _runner(tmp_path: Path, port: int, rank: int, retired: dict[int, bool] | None = None) -> IncidentRunner:
    """Rank ``rank`` of a flat 4-rank job; a raiser waits up to 5 s for the ranks it heard from. Its recorder
    holds gloo all_reduces #seq of the world group, ``retired`` or not."""
    me = flat_rank(tmp_path / f"rank{rank}", port, rank, world=4, gather_seconds=5.0)
    entries = [{"process_group": ("0", "default_pg"), "collective_seq_id": seq, "is_p2p": False,
                "profiling_name": "gloo:all_reduce", "state": "scheduled", "retired": done}
               for seq, done in (retired or {}).items()]
    recorder = pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": entries})
    return IncidentRunner(dataclasses.replace(me, read_recorder=lambda: recorder), ProgressTracker())


def test_a_failure_whose_incident_the_poll_thread_joined_meanwhile_raises_no_second_one(
        tmp_path: Path, port: int) -> None:
    """Rank 0 raises incident 1 for the crash; rank 1's collective fails and, while its exit path waits for the
    runner's lock, its poll thread joins incident 1: rank 1 takes part in incident 1 only, and no incident 2
    is raised."""
    raiser, rank1 = _runner(tmp_path, port, 0), _runner(tmp_path, port, 1)
    rank1.poll([])  # heard from: the raiser's incident stays open until rank 1's part is in
    assert raiser.raise_incident(Trigger.requested(f"uncaught RuntimeError: {CRASH}")) is not None
    asked = threading.Event()
    sequel = rank1.sequel

    def watched_sequel() -> bool:
        asked.set()
        return sequel()
    rank1.sequel = watched_sequel  # type: ignore[method-assign]
    with rank1._lock:  # the poll thread's turn: the exit path waits for it
        failing = threading.Thread(target=rank1.at_exception, args=(CRASH, time.monotonic() + 20))
        failing.start()
        asked.wait(0.5)  # the old code judged "sequel" here, before the lock, and found none
        assert len(rank1.join_open()) == 1
    failing.join(30)
    assert not failing.is_alive()
    assert rank1._known == 1 and rank1._taken == 1
    assert rank1.me.channel.owner(2) is None, "a second incident for the same crash"
    rank1.stop(5)
    raiser.stop(5)


def test_a_failure_with_no_incident_open_still_raises_one(tmp_path: Path, port: int) -> None:
    """The control: the same failure on a rank that took part in nothing raises incident 1."""
    rank1 = _runner(tmp_path, port, 1)
    rank1.at_exception(CRASH, time.monotonic() + 20)
    owner = rank1.me.channel.owner(1)
    assert owner is not None and owner["rank"] == 1 and "Connection closed by peer" in owner["reason"]
    rank1.stop(5)


def _world(completed: int, inflight: int | None = None) -> tuple[GroupStatus, ...]:
    return (GroupStatus("0", "default_pg", (0, 1, 2, 3), 0, completed + (inflight is not None), completed,
                        inflight_seq=inflight),)


@pytest.mark.parametrize("seen", ["in flight", "retired"])
def test_a_failure_long_after_joining_with_no_collective_completed_since_is_that_incidents_sequel(
        tmp_path: Path, port: int, monkeypatch: pytest.MonkeyPatch, seen: str) -> None:
    """Rank 1 joins the crash's incident between collectives (#41 done, #42 not yet entered, so it covers
    nothing); its #42 fails past the sequel window (seen on a loaded lab: incident 2 for one crash), whether
    its poll saw #42 in flight or gloo had already retired it: no collective completed since it took part,
    so it raises none (its failure marks go in its exit copy)."""
    monkeypatch.setattr(incident_memory, "SEQUEL_WINDOW_S", 0.0)
    raiser, rank1 = _runner(tmp_path, port, 0), _runner(tmp_path, port, 1, retired={41: True, 42: True})
    rank1._tracker.statuses = _world(41)
    assert raiser.raise_incident(Trigger.requested(f"uncaught RuntimeError: {CRASH}")) is not None
    assert len(rank1.join_open()) == 1
    rank1._tracker.statuses = _world(41, inflight=42) if seen == "in flight" else _world(42)
    rank1.at_exception(CRASH, time.monotonic() + 20)
    assert rank1.me.channel.owner(2) is None, "a second incident for the same crash"
    assert [(f.group, f.seq) for f in rank1.failed] == [("0", 42)]
    rank1.stop(5)
    raiser.stop(5)


def test_a_failure_after_training_went_on_past_the_incident_raises_a_new_one(
        tmp_path: Path, port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: rank 1 took part in incident 1, then completed #42 and #43; #44 fails: a new incident."""
    monkeypatch.setattr(incident_memory, "SEQUEL_WINDOW_S", 0.0)
    raiser = _runner(tmp_path, port, 0)
    rank1 = _runner(tmp_path, port, 1, retired={42: True, 43: True, 44: True})
    rank1._tracker.statuses = _world(41)
    assert raiser.raise_incident(Trigger.requested(f"uncaught RuntimeError: {CRASH}")) is not None
    assert len(rank1.join_open()) == 1
    rank1._tracker.statuses = _world(43, inflight=44)
    rank1.at_exception(CRASH, time.monotonic() + 20)
    owner = rank1.me.channel.owner(2)
    assert owner is not None and owner["rank"] == 1, "a failure after training went on is a new incident"
    rank1.stop(5)
    raiser.stop(5)


def test_an_exception_of_the_training_code_long_after_joining_is_a_new_incident(
        tmp_path: Path, port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rank, the same standstill since it took part, but its own code raises (no collective failed):
    a new incident, not a sequel."""
    monkeypatch.setattr(incident_memory, "SEQUEL_WINDOW_S", 0.0)
    raiser, rank1 = _runner(tmp_path, port, 0), _runner(tmp_path, port, 1, retired={41: True})
    rank1._tracker.statuses = _world(41)
    assert raiser.raise_incident(Trigger.requested(f"uncaught RuntimeError: {CRASH}")) is not None
    assert len(rank1.join_open()) == 1
    rank1.at_exception(ValueError("a bad batch"), time.monotonic() + 20)
    owner = rank1.me.channel.owner(2)
    assert owner is not None and owner["rank"] == 1 and "ValueError" in owner["reason"]
    rank1.stop(5)
    raiser.stop(5)


@pytest.mark.parametrize("seen", ["looking for open ones", "looking again to raise", "losing the claim"])
def test_a_failure_just_after_another_ranks_incident_for_it_concluded_raises_no_second_one(
        tmp_path: Path, port: int, seen: str) -> None:
    """Rank 0 raises incident 1 for the crash and concludes it (its gathering was quick) before rank 1's collective
    fails: too late to join, but rank 1 raises no incident 2, whether it finds incident 1 concluded as it looks
    for open ones, as it looks again before raising, or as it loses the claim to number 1 (it looked just before
    rank 0 raised it) (seen on the lab: rank 4 raised incident 2 for one crash)."""
    raiser, rank1 = _runner(tmp_path, port, 0), _runner(tmp_path, port, 1)
    rank1._tracker.statuses = _world(41)
    assert raiser.raise_incident(Trigger.requested(f"uncaught RuntimeError: {CRASH}")) is not None
    raiser.me.channel.set_result(1, {"verdict": "hang"})
    if seen == "losing the claim":
        rank1.join_open = lambda deadline=None: []  # type: ignore[method-assign]
    if seen == "looking again to raise":  # its first look came before incident 1 was there (seen beside a CPU hog)
        looks, real = [], rank1.join_open
        rank1.join_open = lambda deadline=None: real(deadline) if looks.append(1) or len(looks) > 1 else []  # type: ignore[method-assign]
    rank1.at_exception(CRASH, time.monotonic() + 20)
    assert rank1.me.channel.owner(2) is None, "a second incident for the same crash"
    assert rank1._known == 1
    rank1.stop(5)
    raiser.stop(5)


def test_a_stall_another_rank_raises_for_between_this_ranks_two_looks_raises_no_second_incident(
        tmp_path: Path, port: int) -> None:
    """Two node leaders see all_reduce #13 pass the threshold in the same poll (seen on a loaded 3-host lab:
    ranks 0 and 2 raised incidents 1 and 2, both 10.28 s in): rank 1 looks (nothing yet), rank 0 raises incident
    1, rank 1 looks again as it raises and joins incident 1. That covers its stall: it claims no number 2."""
    raiser, rank1 = _runner(tmp_path, port, 0), _runner(tmp_path, port, 1)
    rank1._tracker.statuses = _world(12, inflight=13)
    looks, real = [], rank1.join_open

    def look(deadline: float | None = None) -> list[threading.Event]:
        looks.append(1)
        if len(looks) == 1:  # raise_for's own look: before rank 0's claim; rank 0 raises right after it
            found = real(deadline)
            raiser.raise_for(_stall(13))
            return found
        return real(deadline)
    rank1.join_open = look  # type: ignore[method-assign]
    rank1.raise_for(_stall(13))
    assert len(looks) >= 2 and rank1._known == 1 and rank1._taken == 1
    assert rank1.me.channel.owner(2) is None, "a second incident for the same stall"
    for r in (rank1, raiser):
        assert r.wait_idle(20)
        r.stop(5)


def test_a_failure_long_after_a_concluded_incident_it_had_no_part_in_raises_a_new_one(
        tmp_path: Path, port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: incident 1 concluded more than the sequel window ago: rank 1's failure is a new incident."""
    monkeypatch.setattr(incident_memory, "SEQUEL_WINDOW_S", 0.0)
    raiser, rank1 = _runner(tmp_path, port, 0), _runner(tmp_path, port, 1)
    assert raiser.raise_incident(Trigger.requested("uncaught RuntimeError: an earlier failure")) is not None
    raiser.me.channel.set_result(1, {"verdict": "hang"})
    rank1.at_exception(CRASH, time.monotonic() + 20)
    owner = rank1.me.channel.owner(2)
    assert owner is not None and owner["rank"] == 1
    rank1.stop(5)
    raiser.stop(5)


def _stall(seq: int) -> list[Stall]:
    group = GroupStatus("0", "default_pg", (0, 1, 2, 3), 0, seq, seq - 1, inflight_seq=seq,
                        inflight_since_ns=time.time_ns() - 20 * 10**9)
    return [Stall(group, 20.0, 10.0)]


@pytest.mark.parametrize("seen", ["looking for open ones", "losing the claim"])
def test_a_stall_whose_incident_concluded_before_this_rank_looked_raises_no_second_one(
        tmp_path: Path, port: int, seen: str) -> None:
    """Rank 0 raises incident 1 for all_reduce #13 and concludes it before rank 1's poll thread looks (rank 1
    slow under load; seen on a loaded 3-host lab: rank 0 raised incident 2 for the frozen host rank 2 had raised
    incident 1 for): rank 1 raises nothing for the same #13, whether it finds incident 1 concluded as it looks
    or as it loses the claim to number 1."""
    raiser, rank1 = _runner(tmp_path, port, 0), _runner(tmp_path, port, 1)
    raiser.raise_for(_stall(13))
    assert raiser.me.channel.owner(1) is not None and raiser.wait_idle(20)
    raiser.me.channel.set_result(1, {"verdict": "hang"})
    if seen == "losing the claim":
        rank1.join_open = lambda deadline=None: []  # type: ignore[method-assign]
    rank1.raise_for(_stall(13))
    assert rank1.me.channel.owner(2) is None, "a second incident for the same stall"
    assert rank1._known == 1 and rank1._taken == 0
    rank1.raise_for(_stall(13))  # and not on its next poll either
    assert rank1.me.channel.owner(2) is None
    rank1.stop(5)
    raiser.stop(5)


def test_a_new_stall_after_a_concluded_incident_for_an_earlier_one_is_a_new_incident(
        tmp_path: Path, port: int) -> None:
    """The control: incident 1 was raised (and concluded) for #12; rank 1's stall is on #13: incident 2."""
    raiser, rank1 = _runner(tmp_path, port, 0), _runner(tmp_path, port, 1)
    raiser.raise_for(_stall(12))
    assert raiser.wait_idle(20)
    raiser.me.channel.set_result(1, {"verdict": "hang"})
    rank1.raise_for(_stall(13))
    owner = rank1.me.channel.owner(2)
    assert owner is not None and owner["rank"] == 1 and owner["seq"] == 13
    rank1.stop(5)
    raiser.stop(5)


def test_an_earlier_runs_concluded_incident_for_the_same_collective_covers_nothing_in_this_run(
        tmp_path: Path, port: int) -> None:
    """The store holds incident 1, concluded, raised for all_reduce #13 before this run's agents started (an
    earlier run of the job, restarted on the same store): a rank that skips it covers nothing by it (no sequel
    either), and this run's stall on #13 is a new incident."""
    raiser = _runner(tmp_path, port, 0)
    raiser.raise_for(_stall(13))
    assert raiser.wait_idle(20)
    raiser.me.channel.set_result(1, {"verdict": "hang"})
    time.sleep(0.01)  # this run's agents start after incident 1 was raised
    rank1, rank2 = _runner(tmp_path, port, 1), _runner(tmp_path, port, 2)
    assert rank2.join_open() == [] and rank2._known == 1  # skipped: concluded
    assert not rank2._memory.covers(("0", 13)) and not rank2._memory.unresolved(_world(12, inflight=13))
    rank1.raise_for(_stall(13))
    owner = rank1.me.channel.owner(2)
    assert owner is not None and owner["rank"] == 1 and owner["seq"] == 13
    for r in (rank1, rank2, raiser):  # no incident work left running into the next test (its store is gone)
        assert r.wait_idle(20)
        r.stop(5)
