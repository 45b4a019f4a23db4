"""The cyclic GC pause: overlapping pauses end with the last one, and a user's own gc.disable() stands."""

from __future__ import annotations

import gc
import threading

from fr_otel.common.gc_pause import gc_paused


def test_a_pause_that_ends_first_does_not_end_another_thread_s() -> None:
    """The poll thread's pause begins, the coordinator's begins, the poll thread's ends: the collector stays off
    until the coordinator's ends (each pause restoring what it saw at its own start turned it back on)."""
    assert gc.isenabled()
    first_began, second_began, first_ended = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with gc_paused():
            first_began.set()
            second_began.wait(10)
        first_ended.set()

    thread = threading.Thread(target=first)
    thread.start()
    assert first_began.wait(10)
    with gc_paused():
        second_began.set()
        assert first_ended.wait(10)
        assert not gc.isenabled(), "the first pause's end turned the collector back on inside the second"
    thread.join()
    assert gc.isenabled()


def test_a_user_who_turned_the_collector_off_keeps_it_off() -> None:
    """gc.disable() before the pause (Megatron's --manual-gc) is still in force after it."""
    gc.disable()
    try:
        with gc_paused():
            with gc_paused():
                pass
        assert not gc.isenabled()
    finally:
        gc.enable()
