"""Incident context without a live job: where a rank runs, what it is doing now, one identity."""

from __future__ import annotations

import os
import socket

import pytest

from fr_otel.rank_process import RankProcess, process_from_raw, this_process


def test_this_process_says_host_pid_and_local_rank() -> None:
    """The agent describes its own process: host name, pid, local rank."""
    me = this_process(3)
    assert (me.host, me.pid, me.local_rank, me.source) == (socket.gethostname(), os.getpid(), 3, "agent")
    assert me.label == f"host {me.host}, pid {me.pid}" and me.address == f"{me.host}:{me.pid}"


def test_process_from_raw_round_trips_its_json_shape() -> None:
    """What the payload carries reads back as the same record."""
    where = RankProcess(host="node-7", pid=4242, local_rank=1, source="agent")
    assert process_from_raw(where.as_json(), "agent") == where


@pytest.mark.parametrize("raw", [
    None, "vm:42", [], {}, {"host": 7, "pid": "42"}, {"host": "", "pid": -1}, {"host": "x" * 300},
    {"host": "evil\nline"}, {"pid": True}, {"pid": 1 << 40},
])
def test_process_from_raw_drops_what_untrusted_dumps_get_wrong(raw: object) -> None:
    """Wrong types, empty or control-character hosts and absurd pids are dropped, never trusted."""
    assert process_from_raw(raw, "agent") is None


def test_process_from_raw_keeps_the_good_half() -> None:
    """A well-typed pid survives next to a bad host."""
    assert process_from_raw({"host": 7, "pid": 12}, "agent") == RankProcess(pid=12, source="agent")
