"""What a node's ranks and leader read from the node folder is untrusted: a FIFO, a bad shape, a stamp from
the future or a zlib bomb costs a skipped file, never a blocked, crashed or fooled training rank."""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fr_otel.agent.observe import payload as payload_module
from fr_otel.agent.links.node_channel import Board, NodeChannel
from fr_otel.agent.observe.payload import decode_payload

POLL = 0.5


def _returns_quickly(call: Callable[[], Any], fifo: Path) -> Any:
    """``call``'s result, failing if it is still blocked (on ``fifo``) after two seconds."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(2.0)
    blocked = thread.is_alive()
    if blocked:  # let the blocked open go: a writer comes
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(2.0)
    assert not blocked, f"blocked on the FIFO at {fifo}"
    return out[0]


def test_a_fifo_planted_as_the_board_does_not_block_a_rank(tmp_path: Path) -> None:
    """``board`` as a FIFO: no board (None) at once."""
    os.mkfifo(tmp_path / "board")
    assert _returns_quickly(NodeChannel(tmp_path, 1).board, tmp_path / "board") is None


def test_a_fifo_planted_as_a_heartbeat_or_a_payload_does_not_block_the_leader(tmp_path: Path) -> None:
    """``hb.2`` and ``i4/rank_2.payload`` as FIFOs: skipped at once; rank 3's real files still read."""
    leader = NodeChannel(tmp_path, 0)
    NodeChannel(tmp_path, 3).beat(123, 7)
    NodeChannel(tmp_path, 3).drop_payload(4, b"three")
    os.mkfifo(tmp_path / "hb.2")
    os.mkfifo(tmp_path / "i4" / "rank_2.payload")
    assert _returns_quickly(leader.beats, tmp_path / "hb.2") == {3: (123, 7)}
    assert _returns_quickly(lambda: leader.payloads(4, [2, 3]), tmp_path / "i4" / "rank_2.payload") == {3: b"three"}


@pytest.mark.parametrize("shape", [{"incidents": 5}, {"incidents": [[1, {}]], "sent": [3]},
                                   {"sent": {"2": 5, "x": [1]}, "ended": {"a": 1}}])
def test_a_board_with_fields_of_the_wrong_shape_is_read_without_them(tmp_path: Path, shape: dict[str, Any]) -> None:
    """Leader, pid and stamp kept; a field of the wrong shape dropped, never an exception in the rank."""
    (tmp_path / "board").write_text(json.dumps({"leader": 0, "pid": 9, "polled_ns": 5, **shape}))
    board = NodeChannel(tmp_path, 1).board()
    assert board is not None and (board.leader, board.pid, board.polled_ns) == (0, 9, 5)


def test_a_board_stamped_in_the_future_is_not_fresh(tmp_path: Path) -> None:
    """A stamp ten polls ahead of our clock proves nothing about the leader being alive now."""
    now = time.time_ns()
    assert Board(0, 9, now).fresh(now, POLL)
    assert not Board(0, 9, now + int(10 * POLL * 1e9)).fresh(now, POLL)


def test_a_payload_inflating_past_the_limit_is_refused_without_inflating_it_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A zlib bomb from a rank: one problem line naming the limit, never the whole inflated body."""
    monkeypatch.setattr(payload_module, "DEFAULT_MAX_FILE_BYTES", 1 << 20)
    bomb = struct.pack(">4sQ", b"FRO1", 1) + zlib.compress(b"\0" * (8 << 20), 9)
    problems: list[str] = []
    assert decode_payload(bomb, 3, "rank 3", problems) is None
    assert problems == [f"rank 3: over {1 << 20} bytes inflated; skipped"]


def _plant_heartbeats(folder: Path, first: int, count: int) -> None:
    for rank in range(first, first + count):
        os.close(os.open(folder / f"hb.{rank}", os.O_WRONLY | os.O_CREAT, 0o600))


def test_planted_heartbeats_of_ranks_outside_the_job_are_never_read(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """5,000 ``hb.N`` files of ranks the 8-rank job does not have: names are checked before anything is read,
    so the leader reads only its real ranks' heartbeats."""
    from fr_otel.agent.links import node_channel

    reads: list[str] = []
    real_read = node_channel.read_regular
    monkeypatch.setattr(node_channel, "read_regular", lambda path, *a, **k: (reads.append(str(path)),
                                                                             real_read(path, *a, **k))[1])
    for rank in range(4):
        NodeChannel(tmp_path, rank).beat(100 + rank, rank)
    _plant_heartbeats(tmp_path, 8, 5000)
    leader = NodeChannel(tmp_path, 0, world_size=8)
    beats = leader.beats()
    assert set(beats) <= {0, 1, 2, 3} and len(reads) <= 4, (sorted(beats), len(reads))


def test_a_node_folder_crowded_with_planted_files_is_read_bounded_with_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """5,000 planted ``hb.N`` files and no world size to tell them by: the leader stops looking after
    MAX_SCANNED entries, reads at most MAX_RANKS_PER_NODE files per beat, and says so once."""
    import logging

    from fr_otel.agent.links import node_channel
    from fr_otel.agent.links.node_channel import MAX_RANKS_PER_NODE

    reads: list[str] = []
    real_read = node_channel.read_regular
    monkeypatch.setattr(node_channel, "read_regular", lambda path, *a, **k: (reads.append(str(path)),
                                                                             real_read(path, *a, **k))[1])
    _plant_heartbeats(tmp_path, 0, 5000)
    leader = NodeChannel(tmp_path, 0)
    with caplog.at_level(logging.WARNING, "fr_otel.agent"):
        for _ in range(3):
            leader.beats()
    assert len(reads) <= 3 * MAX_RANKS_PER_NODE
    lines = [r.getMessage() for r in caplog.records if "only those are read" in r.getMessage()]
    assert len(lines) == 1 and str(tmp_path) in lines[0], lines
