"""A stall a node's member sees is its leader's to raise or join first: in a job-wide hang 100k ranks must not
each raise through the store at once; a stall the leader cannot see is raised by the member after 3 polls."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from support.counting_store import CountingStore
from support.node_ranks import node_rank
from support.stopwatch import Stopwatch

from fr_otel.agent.incident.runner import IncidentRunner
from fr_otel.agent.links.node_channel import STALE_POLLS
from fr_otel.agent.observe.poller import ProgressTracker, Stall
from fr_otel.agent.observe.state import GroupStatus
from fr_otel.common.ports import unused_tcp_port

POLL = 0.2


def _stall(group: str, ranks: tuple[int, ...]) -> Stall:
    status = GroupStatus(name=group, desc="g", ranks=ranks, local_id=0, enqueued=5, completed=4, inflight_seq=5,
                         inflight_since_ns=time.time_ns() - 70 * 10**9, exact=True, op="all_reduce")
    return Stall(status, 70.0, 60.0)


def _pair(tmp_path: Path, max_incidents: int = 10) -> tuple[object, IncidentRunner, IncidentRunner]:
    port = unused_tcp_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    leader = IncidentRunner(node_rank(tmp_path, port, 0, POLL, max_incidents), ProgressTracker())
    member = IncidentRunner(node_rank(tmp_path, port, 1, POLL, max_incidents), ProgressTracker())
    leader.poll([])
    member.poll([])
    return server, leader, member


def test_in_a_job_wide_hang_the_member_joins_through_its_leader_and_raises_nothing(tmp_path: Path) -> None:
    """Leader and member both stalled in group 0: the member polls first every time, yet the incident is the
    leader's (raised by rank 0) and the member takes part in it from the board, with no claim of its own."""
    server, leader, member = _pair(tmp_path)
    stall = [_stall("0", (0, 1))]
    for _ in range(3 * STALE_POLLS):
        member.poll(stall)
        leader.poll(stall)
        time.sleep(POLL)
    owner = leader.me.channel.owner(1)
    assert owner is not None and owner["rank"] == 0
    assert member._known == 1 and leader.me.channel.owner(2) is None
    del server


def test_a_stall_its_leader_cannot_see_is_raised_by_the_member_after_three_polls(tmp_path: Path) -> None:
    """The member alone is stalled (in group 7, which its leader is not in): no incident during its first
    3 polls of waiting, then the member raises it through the store itself."""
    server, leader, member = _pair(tmp_path)
    stall = [_stall("7", (1, 9))]
    began = time.monotonic()
    raised_after = None
    while time.monotonic() - began < 5 * STALE_POLLS * POLL and raised_after is None:
        member.poll(stall)
        leader.poll([])
        if leader.me.channel.owner(1) is not None:
            raised_after = time.monotonic() - began
        time.sleep(POLL)
    assert raised_after is not None and raised_after >= STALE_POLLS * POLL
    owner = leader.me.channel.owner(1)
    assert owner is not None and owner["rank"] == 1
    del server


def test_once_the_job_s_incident_cap_is_reached_a_member_s_new_stall_costs_no_store_request(tmp_path: Path) -> None:
    """With FR_OTEL_MAX_INCIDENTS=1 spent on the job-wide hang, a new stall of the member's own (group 7) can be
    covered by no incident: past the 3-poll wait the member makes no store request for it (it made two or
    three every poll before, on every rank: the herd the wait removes)."""
    server, leader, member = _pair(tmp_path, max_incidents=1)
    stall = [_stall("0", (0, 1))]
    for _ in range(2 * STALE_POLLS):
        member.poll(stall)
        leader.poll(stall)
        time.sleep(POLL)
    assert member._known == 1
    counted = CountingStore(member.me.channel.store._store)  # type: ignore[attr-defined]
    member.me.channel.store._store = counted  # type: ignore[attr-defined]
    for _ in range(3 * STALE_POLLS):
        member.poll([*stall, _stall("7", (1, 9))])
        leader.poll(stall)  # its leader keeps polling: the member stays relayed
        time.sleep(POLL)
    assert counted.requests == 0
    del server


def test_when_the_leader_finds_the_store_gone_its_member_raises_locally_at_once(tmp_path: Path) -> None:
    """The store's server frozen (SIGSTOP): the leader's call times out and its board says the store is down.
    A member's stall then goes to a local incident on the member's next poll: no 3-poll wait for the leader
    (a leader's local incident is not on the board) and no store call of its own to time out first."""

    from support.store_process import freeze, store_process

    with store_process() as (port, server):
        leader = IncidentRunner(node_rank(tmp_path, port, 0, POLL), ProgressTracker())
        member = IncidentRunner(node_rank(tmp_path, port, 1, POLL), ProgressTracker())
        leader.poll([])
        member.poll([])
        freeze(server)
        deadline = time.monotonic() + 60  # a poll's store call times out (the link's 5 s): its board says so
        while leader.me.channel.reachable() and time.monotonic() < deadline:  # (under load, one poll once left it so)
            leader.poll([])
        assert member.me.node is not None and not leader.me.channel.reachable()
        watch = Stopwatch()
        member.poll([_stall("0", (0, 1))])
        assert member._known == 1, "the member's stall went to a local incident on its first poll"
        assert watch.seconds() < 2
