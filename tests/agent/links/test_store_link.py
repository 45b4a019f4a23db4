"""The agent's store calls are bounded: a frozen store host (no TCP reset, as in a partition) never holds a rank."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from fr_otel.agent.links.store_link import StoreLink, StoreUnavailable

dist = pytest.importorskip("torch.distributed")

from support.store_process import freeze, store_process  # noqa: E402 - needs torch
from support.stopwatch import Stopwatch


@pytest.fixture
def store_server() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A TCPStore master in its own process, so the test can freeze it like a lost host."""
    with store_process() as (port, server):
        yield server, port


def test_a_call_to_a_frozen_store_ends_within_its_timeout_and_the_next_fails_at_once(store_server) -> None:
    """check() on a store whose host is frozen returns StoreUnavailable in ~timeout; later calls fail fast."""
    proc, port = store_server
    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    link = StoreLink(timeout_s=1.0)
    assert link.call(lambda: client.check(["k"]), "check") is False
    freeze(proc)
    watch = Stopwatch()
    with pytest.raises(StoreUnavailable, match="no answer"):
        link.call(lambda: client.check(["k"]), "check")
    assert 0.9 < watch.wall() and watch.seconds() < 3.0
    assert link.unreachable_since_ns is not None and not link.reachable()
    watch = Stopwatch()
    with pytest.raises(StoreUnavailable):
        link.call(lambda: client.set("k", "v"), "set")
    assert watch.seconds() < 0.5  # no second wait behind the stuck call
    os.kill(proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while not link.reachable() and time.monotonic() < deadline:  # the stuck call returns once the host thaws
        time.sleep(0.05)
    assert link.call(lambda: client.check(["k"]), "check") is False
    assert link.unreachable_since_ns is None


def test_a_callers_deadline_bounds_a_call_below_the_links_timeout(store_server) -> None:
    """The exit path's budget wins over the per-call timeout: a 10 s link gives up at the 0.5 s deadline."""
    proc, port = store_server
    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    link = StoreLink(timeout_s=10.0)
    freeze(proc)
    watch = Stopwatch()
    with link.deadline(time.monotonic() + 0.5), pytest.raises(StoreUnavailable):
        link.call(lambda: client.get("k"), "get")
    assert watch.seconds() < 1.5
    with link.deadline(time.monotonic() - 1), pytest.raises(StoreUnavailable, match="no time left"):
        link.call(lambda: client.get("k"), "get")


def test_a_deadline_is_the_calling_threads_and_the_nearer_of_two_wins() -> None:
    """A helper thread does not inherit its starter's deadline: it must take :meth:`current_deadline` along."""
    link = StoreLink(timeout_s=1.0)
    seen: list[float | None] = []
    with link.deadline(100.0):
        with link.deadline(200.0):
            assert link.current_deadline() == 100.0
        helper = threading.Thread(target=lambda: seen.append(link.current_deadline()))
        helper.start()
        helper.join()
    assert seen == [None] and link.current_deadline() is None


def test_a_deadline_that_runs_out_in_the_queue_says_nothing_of_the_store() -> None:
    """A helper thread's short deadline spent behind another call is not a store failure: no back-off, no
    'unreachable since' (which a verdict would read as the store lost)."""
    link = StoreLink(timeout_s=5.0)
    busy = threading.Thread(target=lambda: link.call(lambda: time.sleep(1.0), "slow get"))
    busy.start()
    time.sleep(0.1)
    with link.deadline(time.monotonic() + 0.2), pytest.raises(StoreUnavailable, match="queued behind"):
        link.call(lambda: 42, "get")
    busy.join()
    assert link.unreachable_since_ns is None and link.reachable()
    assert link.call(lambda: 42, "get") == 42


def test_an_error_the_store_raises_reaches_the_caller_as_is() -> None:
    """A store that refuses (not a timeout) raises its own error; the link stays usable."""
    link = StoreLink(timeout_s=1.0)

    def refuse() -> None:
        raise RuntimeError("connection reset")

    with pytest.raises(RuntimeError, match="reset"):
        link.call(refuse, "set")
    assert link.call(lambda: 42, "get") == 42 and link.unreachable_since_ns is None
