"""A node summary is untrusted input like a dump: a bad one is one problem line, never an exception."""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from support.scale_job import NO_FAULT, host_of, layout_for, payload_for

from fr_otel.agent.incident.relay import summarise_node
from fr_otel.read.node_summary import decode_node_summary
from fr_otel.read.safe_pickle import load_restricted

WORLD = 64
_HEADER = struct.Struct(">4sQ")


def _summary() -> bytes:
    """One real node's summary (8 ranks, the leaders' own encoder)."""
    t_end = time.time_ns()
    payloads = {r: payload_for(layout_for(WORLD), r, NO_FAULT, t_end) for r in range(8)}
    problems: list[str] = []
    blob, ranks, _ = summarise_node(host_of(0), 0, payloads, {r: t_end for r in payloads}, problems)
    assert not problems and ranks == tuple(range(8))
    return blob


def _rewritten(blob: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """``blob`` with its body changed by ``change`` (re-encoded as the leader would)."""
    import pickle  # pickling our own test data, never reading untrusted bytes

    magic, made = _HEADER.unpack_from(blob)
    body, _ = load_restricted(zlib.decompress(blob[_HEADER.size:]))
    change(body)
    return _HEADER.pack(magic, made) + zlib.compress(pickle.dumps(body, protocol=4), 1)


def _flag_of_two(body: dict[str, Any]) -> None:
    history = body["ranks"][3]["histories"][0]
    history[4] = b"\x02" + history[4][1:]


def _short_flags(body: dict[str, Any]) -> None:
    history = body["ranks"][5]["histories"][0]
    history[4] = history[4][:-1]


@pytest.mark.parametrize(("change", "rank"), [(_flag_of_two, 3), (_short_flags, 5)])
def test_a_rank_record_with_a_bad_completion_flag_column_is_left_out_with_one_line(
        change: Callable[[dict[str, Any]], None], rank: int) -> None:
    """A flag column holding a 2, or shorter than its group's columns, costs that rank's record (one
    problem line), even when an equal good column of another rank was met first; the others decode."""
    blob = _summary()
    problems: list[str] = []
    good = decode_node_summary(blob, "node 1", problems, {})
    assert good is not None and not problems and set(good.dumps) == set(range(8))
    shared: dict[tuple[Any, ...], Any] = {}
    decode_node_summary(blob, "node 0", [], shared)  # the good columns are met first
    node = decode_node_summary(_rewritten(blob, change), "node 1", problems, shared)
    assert node is not None and set(node.dumps) == set(range(8)) - {rank}
    assert len(problems) == 1 and problems[0].startswith("node 1: 1 rank record(s) unusable")
    assert "flag column" in problems[0]


def test_a_blob_that_is_not_a_summary_or_is_cut_short_is_one_problem_line() -> None:
    """Wrong magic, a truncated body, an empty blob: None and one line naming the source."""
    blob = _summary()
    for bad in (b"", b"XXXX" + blob[4:], blob[: len(blob) // 2]):
        problems: list[str] = []
        assert decode_node_summary(bad, "node 7", problems) is None
        assert len(problems) == 1 and problems[0].startswith("node 7: ")
