"""What anyone who reaches the job's TCPStore can write is trusted no further than the job's shape: forged
counters, node heartbeats, zlib bombs and incident owners cost a bounded amount of work and one log line per
kind of forgery, never a missed or late incident. Every case runs on a real TCPStore on loopback."""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from support.counting_store import CountingStore
from support.node_ranks import flat_rank, node_rank

from fr_otel.agent.hang_abort import ABORT_EXIT_CODE, HangAbort
from fr_otel.agent.incident.rank import IncidentRank, dump_path
from fr_otel.agent.incident.runner import IncidentRunner
from fr_otel.agent.incident.files import MAX_FILES_INFLATED, fetch_files_later
from fr_otel.agent.observe.poller import ProgressTracker
from fr_otel.agent.observe.state import GroupStatus
from fr_otel.agent.incident.gather import read_heartbeats
from fr_otel.common.ids import trace_id_for
from fr_otel.incident.trigger import SeenStall, Trigger

WORLD = 4


def _forger(port: int) -> Any:
    """Anyone who reaches the store's port: a client writing straight into the job's keys."""
    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    return dist.PrefixStore("fr_otel/job/", client)


def _plant(forger: Any, key: str, value: str | bytes) -> None:
    """``set`` and wait until the server holds it: a TCPStore ``set`` returns before the server has taken the
    value (a 2 MB one took long enough on a loaded box that the rank under test read before it landed); a
    ``check`` on the same connection is answered only after the ``set`` sent before it."""
    forger.set(key, value)
    assert forger.check([key]), f"{key} not in the store after its set"


class _Lines(logging.Handler):
    """The agent logger's records, kept here: the agent's set-up stops that logger's propagation, and pytest's
    caplog swaps its handler per test phase, so neither sees every line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


_AGENT_LINES = _Lines()


@pytest.fixture(autouse=True)
def _agent_lines() -> Iterator[None]:
    agent_log = logging.getLogger("fr_otel.agent")
    _AGENT_LINES.lines.clear()
    agent_log.addHandler(_AGENT_LINES)
    yield
    agent_log.removeHandler(_AGENT_LINES)


def _forgery_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [line for line in _AGENT_LINES.lines if "forged or stale" in line]


def _counted(me: IncidentRank) -> CountingStore:
    counted = CountingStore(me.channel.store._store)  # type: ignore[attr-defined]
    me.channel.store._store = counted  # type: ignore[attr-defined]
    return counted


def test_a_node_heartbeat_naming_a_hundred_thousand_ranks_is_dropped_whole(
        tmp_path: Path, port: int, caplog: pytest.LogCaptureFixture) -> None:
    """A forged ``nhb/1`` naming 100k ranks (0-3 among them, as alive now) marks none of the job's ranks heard
    or relayed (no node runs 100k processes), in one log line."""
    caplog.set_level(logging.WARNING, logger="fr_otel.agent")
    forger = _forger(port)
    forger.add("nodes", 1)
    now = time.time_ns()
    _plant(forger, "nhb/1", json.dumps({"host": "ghost", "leader": 0, "t": now,
                                    "ranks": {str(r): now for r in range(100_000)}}))
    me = flat_rank(tmp_path, port, 2, world=WORLD)
    hosts, relayed = read_heartbeats(me)
    assert relayed == set() and hosts == {} and set(me.channel.heard) <= {2}, me.channel.heard
    lines = _forgery_lines(caplog)
    assert len(lines) == 1 and "node heartbeat" in lines[0], lines


def _bomb(inflated: int) -> bytes:
    """A zlib stream of JSON naming ranks.json as ``inflated`` bytes of text, made a MiB at a time."""
    deflater = zlib.compressobj(9)
    chunk = b"A" * (1 << 20)
    parts = [deflater.compress(b'{"ranks.json": "')]
    parts.extend(deflater.compress(chunk) for _ in range(inflated >> 20))
    parts.append(deflater.compress(b'"}'))
    parts.append(deflater.flush())
    return b"".join(parts)


def test_a_forged_node_counter_reads_no_more_nodes_than_the_job_has_and_a_later_leader_is_still_heard(
        tmp_path: Path, port: int, caplog: pytest.LogCaptureFixture) -> None:
    """``nodes`` bumped by 10**7 in a 4-rank job (the adversary's case: rank 0 grew by 1.6 GB and its poller froze
    for 100 s): reading the node heartbeats takes a few requests (not one per forged number) and allocates
    well under 100 MB, a leader that registers afterwards gets a number within the job and its ranks are
    heard, and two reads say the forgery once."""
    caplog.set_level(logging.WARNING, logger="fr_otel.agent")
    _forger(port).add("nodes", 10**7)
    leader = node_rank(tmp_path, port, 0, poll=0.2)
    assert leader.node is not None
    leader.node.beat(time.time_ns(), 3)  # the leader's node heartbeat: registers its number first
    assert leader.node.number is not None and 1 <= leader.node.number <= WORLD
    me = flat_rank(tmp_path, port, 2, world=WORLD)
    counted = _counted(me)
    tracemalloc.start()
    try:
        hosts, relayed = read_heartbeats(me)
        read_heartbeats(me)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100 << 20, peak
    assert relayed == {0} and hosts == {0: "node-a"}
    assert counted.requests < 50, counted.requests  # 20,000 node keys: thousands of round trips
    lines = [line for line in _forgery_lines(caplog) if "nodes reads" in line]  # the leader's own line aside
    assert len(lines) == 1 and "node counter" in lines[0], lines


def test_a_zlib_bomb_as_an_incident_s_files_inflates_no_further_than_the_bound_and_leaves_no_file(
        tmp_path: Path, port: int, caplog: pytest.LogCaptureFixture) -> None:
    """``i/1/files`` set to 256 KB of zlib that inflates to 256 MiB of JSON: the node that fetches it allocates
    at most twice the bound for a moment (not 256 MiB, nor the text decoded from it), writes nothing into the incident's folder
    (no ranks.json, no temporary file) and says so in one line."""
    caplog.set_level(logging.WARNING, logger="fr_otel.agent")
    bomb = _bomb(256 << 20)
    assert len(bomb) < 1 << 20
    _plant(_forger(port), "i/1/files", bomb)
    me = flat_rank(tmp_path, port, 1, world=WORLD)
    folder = tmp_path / "incident"
    folder.mkdir()
    tracemalloc.start()
    try:
        fetch_files_later(me, 1, folder, 10)
        for thread in [t for t in threading.enumerate() if t.name == "fr-otel-files"]:
            thread.join(30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * MAX_FILES_INFLATED + (16 << 20), peak  # zlib's output blocks, joined: twice, for a moment
    assert list(folder.iterdir()) == []
    lines = [r.getMessage() for r in caplog.records if "incident 1" in r.getMessage()]
    assert len(lines) == 1 and "inflate to over" in lines[0], lines


def _runner(tmp_path: Path, port: int, rank: int, **config: Any) -> IncidentRunner:
    """Rank ``rank`` of the flat 4-rank job, with a recorder to read (an empty one, as torch's pickle)."""
    me = flat_rank(tmp_path / f"rank{rank}", port, rank, world=WORLD, gather_seconds=2.0)
    recorder = pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []})
    me = dataclasses.replace(me, read_recorder=lambda: recorder,
                             config=dataclasses.replace(me.config, **config))
    return IncidentRunner(me, ProgressTracker())


_MEANT = {"rank": 0, "reason": "stall", "pg_name": "0", "seq": 7}


def _stall(seq: int) -> Trigger:
    """A trigger for a stall on group 0 at ``seq``, in the words of a test."""
    return dataclasses.replace(Trigger.requested("test"), stall=SeenStall("0", seq))


def _record(k: int, record: dict[str, object]) -> Trigger:
    """Incident ``k``'s owner ``record`` as the trigger a raiser claims with."""
    trigger = Trigger.from_record(k, record)
    assert trigger is not None
    return trigger


def test_forged_incident_owners_are_never_joined_and_each_kind_is_said_once(
        tmp_path: Path, port: int, caplog: pytest.LogCaptureFixture) -> None:
    """30 owner keys no raiser wrote (garbage, a rank outside the job, this very rank, dated an hour ahead, and
    well-formed ones without their raiser's mark): rank 1 joins none and writes no dump for them, says each
    of the 5 kinds once; rank 0's raise skips the 30 numbers (a line per kind too), and rank 1 joins it."""
    caplog.set_level(logging.WARNING, logger="fr_otel.agent")
    forger, now = _forger(port), time.time_ns()
    kinds = [b"\x1b[31mnot json", json.dumps({**_MEANT, "rank": 99, "time_ns": now}),
             json.dumps({**_MEANT, "rank": 1, "time_ns": now}),
             json.dumps({**_MEANT, "time_ns": now + 3600 * 10**9}), json.dumps({**_MEANT, "time_ns": now})]
    for k in range(1, 31):
        _plant(forger, f"i/{k}/owner", kinds[(k - 1) % len(kinds)])
    member, raiser = _runner(tmp_path, port, 1), _runner(tmp_path, port, 0)
    assert member.join_open() == []
    assert member._taken == 0 and not list(tmp_path.glob("rank1/*/fr_trace_rank_1"))
    lines = _forgery_lines(caplog)
    assert len(lines) == 5, lines
    done = raiser.raise_incident(_stall(7))
    assert done is not None and raiser._known == 31
    joined = member.join_open()
    assert len(joined) == 1 and member._known == 31 and member._taken == 1
    assert len(_forgery_lines(caplog)) == 5 + 4  # the raiser: a line per kind too (to it, rank 0s name itself)
    member.stop(1)
    raiser.stop(1)


def test_the_incident_cap_holds_for_incidents_joined_from_the_store_and_from_a_node_board(
        tmp_path: Path, port: int, caplog: pytest.LogCaptureFixture) -> None:
    """FR_OTEL_MAX_INCIDENTS=2 and three incidents really raised by rank 0: rank 1 joins two through the store,
    and a node member joins two from its leader's board; each says the cap once."""
    caplog.set_level(logging.WARNING, logger="fr_otel.agent")
    raiser = _runner(tmp_path, port, 0, max_incidents=5)
    for seq in (7, 8, 9):
        raiser._memory.covered.clear()
        assert raiser.raise_incident(_stall(seq)) is not None
    member = _runner(tmp_path, port, 1, max_incidents=2)
    assert len(member.join_open()) == 2 and member._taken == 2
    member.join_open()
    board_member = IncidentRunner(node_rank(tmp_path / "node", port, 2, poll=0.2, max_incidents=2), ProgressTracker())
    incidents = tuple((k, raiser.me.channel.owner(k) or {}) for k in (1, 2, 3))
    board_member.join_board(incidents)
    board_member.join_board(incidents)
    assert board_member._taken == 2 and board_member._known == 2
    capped = [r.getMessage() for r in caplog.records if "FR_OTEL_MAX_INCIDENTS=2" in r.getMessage()]
    assert len(capped) == 2, capped
    for runner in (raiser, member, board_member):
        runner.stop(1)


def test_a_join_whose_verdict_never_comes_does_not_hold_up_this_rank_s_own_incident(
        tmp_path: Path, port: int) -> None:
    """Rank 1 joins an incident whose raiser (rank 0) claimed it and then never coordinates (a forger that
    follows the protocol, or a raiser gone): when rank 1 then raises its own stall, its recorder is in the
    incident's folder within seconds, not after the join's whole budget of waiting for a verdict."""
    ghost = _runner(tmp_path, port, 0)
    meta = {"rank": 0, "reason": "stall", "time_ns": time.time_ns(), "pg_name": "0", "seq": 7}
    won, _ = ghost.me.channel.claim(_record(1, meta))  # the claim and its mark, and nothing after
    assert won
    member = _runner(tmp_path, port, 1, gather_seconds=30.0)
    assert len(member.join_open()) == 1
    time.sleep(1.0)  # its part is sent: it waits for the verdict now
    began = time.monotonic()
    assert member.raise_incident(_stall(8)) is not None and member._known == 2
    mine = dump_path(member.me, f"{trace_id_for(member.me.job_id, '2'):032x}")
    while not mine.exists() and time.monotonic() - began < 20:
        time.sleep(0.1)
    assert mine.exists() and time.monotonic() - began < 8, time.monotonic() - began
    member.stop(1)


def _in_flight(seq: int, age_s: float) -> GroupStatus:
    return GroupStatus("0", "default_pg", tuple(range(WORLD)), 0, enqueued=seq, completed=seq - 1, inflight_seq=seq,
                       inflight_since_ns=time.time_ns() - int(age_s * 1e9), op="all_reduce")


def test_a_forged_hang_verdict_ends_no_rank_whose_own_collectives_move_on(tmp_path: Path, port: int) -> None:
    """Anyone who reaches the store raises incident 1 the protocol's way (claim and mark) and writes a hang
    verdict for it. Rank 1, with FR_OTEL_ON_HANG=abort, joins and reads that verdict, but its own recorder says
    the collective it had in flight completed: it does not end, however long it waits. Only its own evidence
    (that collective still in flight past the abort age) would end it."""
    ghost = _runner(tmp_path, port, 0)
    won, _ = ghost.me.channel.claim(_record(1, {**_MEANT, "time_ns": time.time_ns()}))
    assert won
    member = _runner(tmp_path, port, 1, on_hang="abort", abort_after_seconds=0.5)
    assert member.abort is not None
    ends: list[int] = []
    member.abort = HangAbort(1, 0.5, end=ends.append)
    member._tracker.statuses = (_in_flight(7, 0.05),)  # a collective in flight as it joins, completing normally
    assert len(member.join_open()) == 1
    _plant(_forger(port), "i/1/result", json.dumps({"verdict": "hang", "hang": True, "culprits": [0],
                                                    "exclude_hosts": ["victim"], "trace_id": "0" * 32}))
    assert member.wait_idle(20)
    member._tracker.statuses = (_in_flight(8, 0.01),)
    for _ in range(8):
        time.sleep(0.1)
        member.check_abort()
    member._tracker.statuses = (_in_flight(9, 30.0),)  # a later collective, however old: another incident's matter
    member.check_abort()
    assert ends == []
    member._tracker.statuses = (_in_flight(7, 1.0),)  # had collective #7 stayed in flight: its own evidence
    member.check_abort()
    assert ends == [ABORT_EXIT_CODE]
    member.stop(1)
    ghost.stop(1)
