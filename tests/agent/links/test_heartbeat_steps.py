"""Heartbeats carry the training step: through a node's leader and straight to the store, the coordinator
learns when each rank was last heard and in which step (what a lost host's line says), and keeps them when the
store goes."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from support.node_ranks import flat_rank  # noqa: E402

from fr_otel.agent.links.channel import IncidentChannel, beat_text, parse_beat  # noqa: E402
from fr_otel.agent.links.host_map import HostMapKeeper  # noqa: E402
from fr_otel.agent.links.node_channel import NodeChannel
from fr_otel.agent.links.node_leader import NodeRole
from fr_otel.agent.incident.gather import gather  # noqa: E402
from fr_otel.common.ports import unused_tcp_port  # noqa: E402
from fr_otel.read.rank_process import RankProcess  # noqa: E402

POLL = 0.2


def _channel(port: int) -> IncidentChannel:
    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    return IncidentChannel(dist.PrefixStore("fr_otel/job/", client), "test")


def test_a_heartbeat_is_its_time_and_step_and_anything_else_is_no_heartbeat() -> None:
    """'<ns>' before a step was counted, '<ns> <step>' after; text that is not that is not read as a beat."""
    assert parse_beat(beat_text(17, None)) == (17, None) and parse_beat(beat_text(17, 4)) == (17, 4)
    assert [parse_beat(t) for t in ("", "x", "1 2 3", "-1", "1 -2", "9" * 25, "１２")] == [None] * 7


def test_the_coordinator_learns_each_ranks_step_at_its_last_heartbeat(tmp_path: Path) -> None:
    """Ranks 0-2 beat through their host maps' polls in steps 8, 7 and 5, rank 3 before it counted a step:
    the gathering gives every rank's last-heard time and the steps that were counted."""
    port = unused_tcp_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    before = time.time_ns()
    for rank, step in ((0, 8), (1, 7), (2, 5), (3, None)):
        process = RankProcess(host=f"node{rank // 2}", pid=100 + rank, local_rank=rank % 2, source="agent")
        HostMapKeeper(_channel(port), rank, 4, process, leader=False, folders=list).poll(time.time_ns(), step)
    rank = flat_rank(tmp_path, port, 2, host="node1", poll=POLL, gather_seconds=0.3)
    coordinator = rank.channel
    side = gather(rank, 1, time.monotonic() + 10).evidence.side
    assert side.last_step == {0: 8, 1: 7, 2: 5}
    assert set(side.last_heard) == {0, 1, 2, 3} and min(side.last_heard.values()) >= before
    assert coordinator.steps == {0: 8, 1: 7, 2: 5}  # kept for a verdict after the store is gone
    del server


def test_the_coordinator_learns_each_ranks_step_at_its_last_heartbeat_through_leaders_and_the_store(
        tmp_path: Path) -> None:
    """node-a's leader (rank 0, step 8) beats for rank 1 (step 7, its heartbeat file); rank 2 beats to the store
    itself (step 5), rank 3 before it counted a step: gather gives every rank's last-heard time and step, and the
    channel keeps them (the same facts as the flat heartbeats) for a verdict after the store is gone."""
    port = unused_tcp_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    folder = tmp_path / "node-a"
    roles = [NodeRole(_channel(port), NodeChannel(folder, r), r, RankProcess(host="node-a", pid=100 + r, local_rank=r),
                      leader=r == 0, poll_interval=POLL, world_size=2) for r in (0, 1)]
    before = time.time_ns()
    roles[1].poll(time.time_ns(), 7)  # a member: its heartbeat file, for the leader to send on
    roles[0].poll(time.time_ns(), 8)  # the leader's first poll checks for incidents ...
    roles[0].poll(time.time_ns(), 8)  # ... its second beats for the node
    flat = _channel(port)
    flat.heartbeat(2, time.time_ns(), 5)
    flat.heartbeat(3, time.time_ns())
    assert set(flat.last_heard([2, 3])) == {2, 3} and flat.steps == {2: 5}

    rank = flat_rank(tmp_path, port, 2, host="node-b", poll=POLL, gather_seconds=0.3)
    coordinator = rank.channel
    side = gather(rank, 1, time.monotonic() + 10).evidence.side
    assert side.last_step == {0: 8, 1: 7, 2: 5}
    assert set(side.last_heard) == {0, 1, 2, 3} and min(side.last_heard.values()) >= before
    assert side.processes[1].host == "node-a"  # the node's heartbeat says where its ranks run
    assert coordinator.steps == {0: 8, 1: 7, 2: 5} and set(coordinator.heard) == {0, 1, 2, 3}
    del server
