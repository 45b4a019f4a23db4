"""A leader's board says when it was written, not when its poll began: a poll whose store calls took long
must not hand its ranks a board that is already stale."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from support.node_ranks import node_rank

from fr_otel.agent.links.node_leader import Contact
from fr_otel.agent.incident.runner import IncidentRunner
from fr_otel.agent.links.node_channel import NodeChannel
from fr_otel.agent.observe.poller import ProgressTracker
from fr_otel.common.ports import unused_tcp_port

POLL = 0.5


def test_a_leaders_board_is_stamped_when_written_after_a_slow_poll(tmp_path: Path) -> None:
    """A poll that began ten polls ago (its store calls slow): the board it writes is stamped now, and fresh."""
    server = dist.TCPStore("127.0.0.1", (port := unused_tcp_port()), is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10))
    runner = IncidentRunner(node_rank(tmp_path, port, 0, POLL), ProgressTracker())
    before = time.time_ns()
    runner.poll([], now_ns=before - int(10 * POLL * 1e9))
    board = NodeChannel(tmp_path / "node-a", 1).board()
    assert board is not None and board.polled_ns >= before
    assert board.fresh(time.time_ns(), POLL)
    del server


def test_a_board_written_before_a_store_call_stays_fresh_for_that_call_and_no_longer() -> None:
    """The stale window is 3 polls; a store call may take its link's 5 s. A board that says it is in a call
    of up to 5 s is fresh until then plus the window; a frozen leader's (no such word) is stale after the
    window; a malformed announcement (an hour) is ignored; the word survives the board's JSON."""
    from fr_otel.agent.links.node_channel import STALE_POLLS, Board, _board_from

    t, s = 1_000 * 10**9, 10**9
    window = STALE_POLLS * POLL
    quiet = Board(0, 1, t)
    waiting = Board(0, 1, t, in_store_call_until_ns=t + 5 * s)
    assert quiet.fresh(t + int(window * s), POLL) and not quiet.fresh(t + int((window + 0.1) * s), POLL)
    assert waiting.fresh(t + int((5 + window - 0.01) * s), POLL)
    assert not waiting.fresh(t + int((5 + window + 0.1) * s), POLL)
    hour = Board(0, 1, t, in_store_call_until_ns=t + 3600 * s)
    assert not hour.fresh(t + int((window + 0.1) * s), POLL)
    assert _board_from(waiting.as_json()) == waiting
    assert _board_from({**waiting.as_json(), "in_store_call_until_ns": "soon"}) == quiet


def test_a_slow_store_call_of_the_leader_keeps_its_ranks_relayed(tmp_path: Path) -> None:
    """The store's server is frozen (SIGSTOP) for 4 s (over 2 stale windows, under the link's 5 s bound)
    while the leader polls: the leader's call waits, its board says so, and its rank keeps going through it rather than to the store too.
    Before, the rank saw the board 3 polls old and went to the (slow) store itself."""
    import os
    import signal
    import threading

    from support.store_process import freeze, store_process

    from fr_otel.agent.links.node_channel import STALE_POLLS

    with store_process() as (port, server):
        leader = IncidentRunner(node_rank(tmp_path, port, 0, POLL), ProgressTracker())
        member = node_rank(tmp_path, port, 1, POLL)
        assert member.node is not None
        leader.poll([])  # registers the node; a first board
        frozen_s = 4.0
        assert frozen_s > 2 * STALE_POLLS * POLL
        freeze(server)
        began = time.monotonic()
        polling = threading.Thread(target=leader.poll, args=([],))
        polling.start()
        modes = []
        while time.monotonic() - began < frozen_s:
            modes.append(member.node.poll(time.time_ns()))
            time.sleep(POLL)
        os.kill(server.pid, signal.SIGCONT)
        polling.join(10)
        assert not polling.is_alive()
        assert len(modes) >= 6 and set(modes) == {Contact.RELAYED}, modes
