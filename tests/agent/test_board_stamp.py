"""A leader's board says when it was written, not when its poll began: a poll whose store calls took long
must not hand its ranks a board that is already stale."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from support.node_ranks import node_rank

from fr_otel.agent.incident_runner import IncidentRunner
from fr_otel.agent.node_channel import NodeChannel
from fr_otel.agent.poller import ProgressTracker
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
