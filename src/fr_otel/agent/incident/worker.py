"""The incident work of one rank, on one daemon worker thread, the raiser's own first.

Neither the poll nor the training thread waits for an incident's work unless it asks to
(:meth:`IncidentQueue.wait_idle`, bounded). Work is taken by priority, then in order: the
incident this rank raised (or this node's own, without the store) goes before the joins
queued ahead of it, so a queue of incidents others raised (forged ones among them) never
makes a real stall read its recorder after the stall is over.

The queue is bounded (:data:`MAX_PENDING`, as sentry-python's one worker is): incidents are capped per job
(``max_incidents``), so it never fills in a sane run; a flood of joins (a store full of forged incidents
that pass every check) costs one log line and the joins beyond the bound, never memory or the exit budget.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable

from ...common.log import logger

__all__ = ["MAX_PENDING", "IncidentQueue"]

#: Pieces of incident work pending at most; a piece beyond it is dropped (its event set: nothing to wait for).
MAX_PENDING = 64

_Queued = tuple[int, int, "Callable[[], None] | None"]  # priority, order, work (None: stop)

log = logger("fr_otel.agent")


class IncidentQueue:
    """One worker thread doing queued work by priority (0 first), each piece in a guard of the caller's."""

    def __init__(self) -> None:
        self._jobs: queue.PriorityQueue[_Queued] = queue.PriorityQueue()
        self._order = itertools.count()
        self._worker: threading.Thread | None = None
        self._pending = 0
        self._dropped = 0  # pieces dropped because the queue was full
        self._idle = threading.Condition()

    def put(self, work: Callable[[], None], priority: int) -> threading.Event:
        """Queue ``work``; the event is set once it ran (whatever it raised), or at once when it is a join
        (``priority`` > 0) and :data:`MAX_PENDING` pieces are pending already (dropped, said once). This
        rank's own incidents are never dropped: another rank may wait for its verdict (they are capped per job)."""
        done = threading.Event()
        with self._idle:
            full = self._pending >= MAX_PENDING and priority > 0
        if full:
            if not self._dropped:
                log.warning("%d pieces of incident work are pending: later ones are dropped", MAX_PENDING)
            self._dropped += 1
            done.set()
            return done

        def run() -> None:
            try:
                work()
            finally:
                done.set()
        with self._idle:
            self._pending += 1
        self._jobs.put((priority, next(self._order), run))
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="fr-otel-flush", daemon=True)
            self._worker.start()
        return done

    def queued(self) -> bool:
        """Work waits behind the piece in hand (a join then stops waiting for its verdict)."""
        return not self._jobs.empty()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no work is pending; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, max(timeout, 0.0))

    def stop(self, timeout: float) -> None:
        """End the worker thread (after the work already queued)."""
        if self._worker is not None:
            self._jobs.put((1 << 30, next(self._order), None))
            if self._worker is not threading.current_thread():
                self._worker.join(timeout)
            self._worker = None

    def _work(self) -> None:
        while True:
            run = self._jobs.get()[2]
            if run is None:
                return
            try:
                run()
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()
