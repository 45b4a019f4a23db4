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

from fr_otel.agent import payload as payload_module
from fr_otel.agent.node_channel import Board, NodeChannel
from fr_otel.agent.payload import decode_payload

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
