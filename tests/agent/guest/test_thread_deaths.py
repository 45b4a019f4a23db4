"""A thread that dies of an exception is kept by the agent's threading.excepthook, which chains to the previous."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fr_otel.agent.guest.stack_capture import capture_stacks
from fr_otel.agent.guest.thread_deaths import DEATHS, ThreadDeaths


def test_a_producer_that_died_is_kept_with_its_exception_and_line_and_the_previous_hook_still_runs() -> None:
    """Its name, exception and innermost frame; the hook before it still prints; removed, the previous is back."""
    seen: list[Any] = []
    before = threading.excepthook
    threading.excepthook = seen.append
    deaths = ThreadDeaths()
    try:
        deaths.install()

        def produce() -> None:
            raise ValueError("a corrupt shard")
        t = threading.Thread(target=produce, name="batch-producer")
        t.start()
        t.join()
        (dead,) = deaths.seen()
        assert (dead.name, dead.type, dead.message) == ("batch-producer", "ValueError", "a corrupt shard")
        assert dead.where.endswith(" in produce") and __file__ in dead.where
        assert len(seen) == 1 and seen[0].exc_type is ValueError  # chained
        deaths.uninstall()
        assert threading.excepthook == seen.append
    finally:
        threading.excepthook = before


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # pytest's own hook, chained to
def test_the_stack_capture_sends_the_deaths_the_process_hook_kept() -> None:
    """The process's one record travels with the threads' stacks (what the incident sends)."""
    DEATHS.install()
    try:
        t = threading.Thread(target=lambda: 1 / 0, name="uploader")
        t.start()
        t.join()
        assert any(d.name == "uploader" and d.type == "ZeroDivisionError" for d in capture_stacks().dead)
    finally:
        DEATHS.uninstall()
