"""A node-path write that fails (the node folder planted, full or gone) must not lose a rank's recorder: it goes
through the job's store, the flat path, with one log line."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path

import pytest

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from support.node_ranks import node_rank, store_channel

from fr_otel.agent.links.node_leader import Contact
from fr_otel.agent.incident.part import send_part
from fr_otel.common.ports import unused_tcp_port

POLL = 0.1
K = 7


def test_a_member_that_cannot_leave_its_payload_in_the_node_folder_sends_it_through_the_store(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``i7`` planted as a file: rank 1's drop fails; its recorder is in the store, said in one line."""
    server = dist.TCPStore("127.0.0.1", (port := unused_tcp_port()), is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10))
    leader, member = node_rank(tmp_path, port, 0, POLL), node_rank(tmp_path, port, 1, POLL)
    assert leader.node is not None and member.node is not None
    leader.node.publish_board()
    assert member.node.poll(time.time_ns()) is Contact.RELAYED
    (tmp_path / "node-a" / f"i{K}").write_bytes(b"planted")
    with caplog.at_level(logging.WARNING, "fr_otel.agent"):
        send_part(member, K, b"rank one's recorder", time.monotonic() + 10)
    assert store_channel(port).fetch(K, [1]) == {1: b"rank one's recorder"}
    assert len([r for r in caplog.records if "sends it through the store" in r.getMessage()]) == 1
    del server


def test_a_leader_whose_summary_fails_still_sends_its_own_recorder_through_the_store(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The board's name taken by a folder: the leader's summary step raises; its own recorder goes to the store."""
    server = dist.TCPStore("127.0.0.1", (port := unused_tcp_port()), is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10))
    leader = node_rank(tmp_path, port, 0, POLL)
    assert leader.node is not None
    leader.node.node.beat(time.time_ns())
    (tmp_path / "node-a" / "board").mkdir()
    with caplog.at_level(logging.WARNING, "fr_otel.agent"):
        send_part(leader, K, b"rank zero's recorder", time.monotonic() + 10)
    assert store_channel(port).fetch(K, [0]) == {0: b"rank zero's recorder"}
    assert len([r for r in caplog.records if "summary failed" in r.getMessage()]) == 1
    del server
