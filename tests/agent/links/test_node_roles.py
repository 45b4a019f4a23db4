"""A node's leader and its ranks on a real TCPStore and a real node folder: one store request per node per
poll, incidents relayed through the board, and a leader that stops polling sends its ranks back to the store."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from support.counting_store import CountingStore
from support.scale_job import Fault, host_of, layout_for, payload_for

from fr_otel.agent.links.channel import IncidentChannel
from fr_otel.agent.links.node_channel import STALE_POLLS, NodeChannel
from fr_otel.agent.incident.relay import send_summary, wait_until_sent
from fr_otel.agent.links.node_leader import Contact, NodeRole
from fr_otel.common.ports import unused_tcp_port
from fr_otel.read.node_summary import decode_node_summary
from fr_otel.read.rank_process import RankProcess
from fr_otel.testing.otlp import wait_for

POLL = 0.05  # how fast the tests' loops go
# The roles' own poll interval: a rank counts as heard, and a board as fresh, for STALE_POLLS of them
# (3 s), which no pause of a loaded box outlasts (at 0.05 s a 150 ms pause between a rank's poll and
# its leader's summary once left the rank out).
AGENT_POLL = 1.0


def _store() -> tuple[Any, int]:
    port = unused_tcp_port()
    return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=10)), port


def _channel(port: int) -> tuple[IncidentChannel, CountingStore]:
    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    counted = CountingStore(dist.PrefixStore("fr_otel/job/", client))
    return IncidentChannel(counted, "test"), counted  # type: ignore[arg-type]


def _roles(folder: Path, port: int, ranks: range, poll: float = AGENT_POLL) -> list[tuple[NodeRole, CountingStore]]:
    out = []
    for rank in ranks:
        channel, counted = _channel(port)
        process = RankProcess(host="node-a", pid=100 + rank, local_rank=rank)
        out.append((NodeRole(channel, NodeChannel(folder, rank), rank, process, leader=rank == ranks[0],
                             poll_interval=poll, world_size=len(ranks)), counted))
    return out


def test_a_node_makes_one_store_request_per_poll_and_its_ranks_none_while_their_leader_polls(tmp_path: Path) -> None:
    """Leader and 3 ranks poll 20 times: the leader checks for incidents and beats for all 4 in turn; the others read its board."""
    server, port = _store()
    roles = _roles(tmp_path / "node", port, range(4))
    modes: dict[int, list[Contact]] = {r.rank: [] for r, _ in roles}
    for _ in range(20):
        for role, _ in roles:
            mode = role.poll(time.time_ns())
            modes[role.rank].append(mode)
            if role.leader and mode is Contact.OWNER:
                role.channel.owner(1)  # what the runner does on an incident check
            if role.leader:
                role.publish_board()
        time.sleep(POLL)
    _, counted = roles[0]
    assert modes[0] == [Contact.OWNER, Contact.BEAT] * 10
    assert counted.requests == 20 + 2  # one per poll, plus registering the node once (its number, claimed)
    assert all(set(modes[r]) == {Contact.RELAYED} for r in (1, 2, 3))
    assert all(c.requests == 0 for _, c in roles[1:])
    beat = roles[1][0].channel.node_heartbeats(4)
    assert list(beat) == [1] and beat[1]["host"] == "node-a" and set(beat[1]["ranks"]) == {"0", "1", "2", "3"}
    del server


def test_ranks_whose_leader_stops_polling_go_back_to_the_store_within_a_few_polls(tmp_path: Path) -> None:
    """The leader freezes: after STALE_POLLS polls its ranks keep in touch with the store themselves, and come back when it does."""
    server, port = _store()
    poll = 0.25  # a loaded machine may pause a process 100 ms: the board must not go stale by accident
    (leader, _), (member, _) = _roles(tmp_path / "node", port, range(2), poll)
    for _ in range(3):
        leader.poll(time.time_ns())
        leader.publish_board()
        assert member.poll(time.time_ns()) is Contact.RELAYED
        time.sleep(poll)
    leader.poll(time.time_ns())
    leader.publish_board()
    modes = []
    for _ in range(2 * STALE_POLLS + 2):  # the leader is silent now
        time.sleep(poll)
        modes.append(member.poll(time.time_ns()))
    assert modes[0] is Contact.RELAYED and modes[-1] is Contact.FLAT
    assert modes.index(Contact.FLAT) <= STALE_POLLS + 1
    assert not member.relayed()
    leader.poll(time.time_ns())
    leader.publish_board()
    assert member.poll(time.time_ns()) is Contact.RELAYED
    del server


def test_a_leader_summarises_the_payloads_its_ranks_leave_and_tells_them_it_sent_them(tmp_path: Path) -> None:
    """Each rank leaves its payload in the node folder; the leader's one summary holds all 8, and every rank sees on the board that it went."""
    server, port = _store()
    roles = _roles(tmp_path / "node", port, range(8))
    layout, t_end = layout_for(1024), time.time_ns()
    for role, _ in roles:
        role.node.drop_payload(1, payload_for(layout, role.rank, Fault("stopped", 3), t_end))
    for role, _ in roles:
        role.poll(time.time_ns())  # every rank heard from just now: the leader waits for all 8
    leader = roles[0][0]
    sent = send_summary(leader, 1, time.monotonic() + 5, time.monotonic() + 5)
    assert sent == tuple(range(8))
    assert all(wait_until_sent(role, 1, time.monotonic() + 1) for role, _ in roles[1:])
    assert leader.channel.arrived(1) == 8
    (blob,) = leader.channel.summaries(1, 8).values()
    node = decode_node_summary(blob, "node summary", problems := [])
    assert node is not None and not problems and sorted(node.dumps) == list(range(8))
    assert all(d.compact for d in node.dumps.values())
    assert sorted(node.full) == list(range(8))  # rank 3 stopped early: the node sends its ranks whole
    assert host_of(3) == "node00000" and node.host == "node-a"
    leader.channel.ask(1, "")  # the coordinator needs nothing more: the leader's answering thread ends
    _answers_end()
    del server


def test_a_rank_its_leader_left_out_sends_its_own_payload_through_the_store(tmp_path: Path) -> None:
    """A rank whose payload came after the leader's summary went is told so by the board and publishes itself."""
    server, port = _store()
    (leader, _), (member, _) = _roles(tmp_path / "node", port, range(2))
    leader.poll(time.time_ns())
    member.poll(time.time_ns())
    leader.node.drop_payload(1, payload_for(layout_for(1024), 0, Fault("stopped", 5), time.time_ns()))
    send_summary(leader, 1, time.monotonic() + 0.2, time.monotonic() + 1)  # rank 1 left nothing in time
    assert leader.sent[1] == (0,)
    assert not wait_until_sent(member, 1, time.monotonic() + 1)
    leader.channel.ask(1, "")
    _answers_end()
    del server


def test_ranks_wait_for_the_verdict_on_their_leaders_board_with_no_store_request(tmp_path: Path) -> None:
    """While the leader's board is fresh a member learns from it, not the store, that incident 1's verdict came
    and that the store went away during incident 2 (the node then goes on alone); a stale board sends it to
    the store."""
    server, port = _store()
    poll = 0.5  # its board goes stale after STALE_POLLS of them: the test waits that long
    roles = _roles(tmp_path / "node-a", port, range(3), poll)
    (leader, _), (member, counted), _ = roles
    for role, _ in roles:
        role.poll(time.time_ns())
    leader.publish_board()
    assert member.verdict_word(1) == "waiting" and leader.verdict_word(1) == "ask the store"
    leader.ended_as(1, verdict=True)
    leader.ended_as(2, verdict=False)
    assert (member.verdict_word(1), member.verdict_word(2), member.verdict_word(3)) == ("verdict", "lost", "waiting")
    assert counted.requests == 0
    time.sleep((STALE_POLLS + 1) * poll)  # the leader stops writing its board
    assert member.verdict_word(3) == "ask the store"
    del server


def test_a_leader_sends_no_whole_recorder_once_the_verdict_is_out_and_forgets_the_incident(tmp_path: Path) -> None:
    """Asked for a rank's whole recorder after the coordinator published its verdict (and cleaned the store),
    the leader sends nothing (it would stay in the store for the job's life); asked before, it sends it.
    Either way the node folder's copies of that incident's recorders go once it has answered."""
    server, port = _store()
    (leader, _), (member, _) = _roles(tmp_path / "node", port, range(2))
    layout, t_end = layout_for(1024), time.time_ns()
    for role in (leader, member):
        role.poll(time.time_ns())
    for k in (1, 2):
        for role in (leader, member):
            role.node.drop_payload(k, payload_for(layout, role.rank, Fault("stopped", 5), t_end))
            role.poll(time.time_ns())  # both heard just now: the summary holds both
        assert send_summary(leader, k, time.monotonic() + 5, time.monotonic() + 5) == (0, 1)
    leader.channel.set_result(1, {"verdict": "hang"})
    leader.channel.ask(1, "1")
    leader.channel.ask(2, "1")
    folder = tmp_path / "node"
    _answers_end()  # each answering thread forgets its incident's copies as it ends
    assert leader.channel.fetch(1, [1]) == {}
    assert set(leader.channel.fetch(2, [1])) == {1}
    assert not (folder / "i1").exists() and not (folder / "i2").exists()
    del server


def _answers_end(timeout: float = 60) -> None:
    """Wait until every leader's answering thread has ended (each polls the store once per AGENT_POLL)."""
    def answering() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "fr-otel-node-answer" and t.is_alive()]
    assert wait_for(lambda: not answering(), timeout=timeout, interval=POLL), f"still answering: {answering()}"


class ConcludingStore(CountingStore):
    """A real store on which the coordinator publishes its verdict (and cleans up) just as a whole recorder is
    being sent: the interleaving a leader's check before sending cannot see."""

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if name != "set":
            return attr

        def set_then_conclude(key: str, value: Any) -> Any:
            out = attr(key, value)
            if "/dump/" in key:
                self.store.set("i/1/result", "{}")
            return out

        return set_then_conclude


def test_a_whole_recorder_sent_as_the_verdict_comes_out_is_taken_back(tmp_path: Path) -> None:
    """The verdict comes out (and the coordinator's one clean-up runs) while the leader sends rank 1's whole
    recorder: the leader sees the verdict after sending and deletes what it sent, so nothing stays."""
    from fr_otel.agent.incident.relay import answer_need

    server, port = _store()
    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    channel = IncidentChannel(ConcludingStore(dist.PrefixStore("fr_otel/job/", client)), "test")  # type: ignore[arg-type]
    channel.ask(1, "1")
    answer_need(channel, 1, {1: b"whole recorder of rank 1"}, time.monotonic() + 2, POLL)
    assert channel.concluded(1)
    assert channel.fetch(1, [1]) == {}
    del server
