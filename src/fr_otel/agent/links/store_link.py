"""Every call the agent makes on the job's store, bounded in time: a lost store host never holds a rank.

A TCPStore client blocks in ``recv`` for as long as its server does not answer, and a
partitioned or frozen host sends no TCP reset: ``check``, ``get``, ``wait`` would wait
forever, whatever timeout the store was built with. The agent runs inside the training
process, on paths (excepthook, atexit, SIGTERM) that the process waits for before it may
exit, so a store call there must end in bounded time, answered or not.

So each call runs on this link's own worker thread and the caller waits at most its
timeout (and never past a deadline the caller set for its thread, e.g. the exit path's one
budget). A call that does not answer in time leaves the worker stuck in ``recv``: the link
is then *down* and every call fails at once (no queue builds up) until that call returns.
The worker is a daemon thread blocked in C without the GIL: it never keeps the process
alive. The link also remembers since when the store has not answered
(:attr:`StoreLink.unreachable_since_ns`), which the agent uses to tell "the store's host is
lost" from a slow store, and backs off after repeated failures so a dead store is not
polled (with its ~15-line C++ warning) every second by every rank.
"""

from __future__ import annotations

import contextlib
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ...common.log import logger
from ...common.text import one_line

__all__ = ["STORE_TIMEOUT_S", "LinkedStore", "StoreBackoff", "StoreLink", "StoreUnavailable", "connection_lost"]

#: How long one store call may take before the store counts as not answering.
STORE_TIMEOUT_S = 5.0

log = logger("fr_otel.agent")


class StoreUnavailable(RuntimeError):
    """The store did not answer in time, failed repeatedly, or the caller's deadline is spent."""


_LOST_WORDS = re.compile(r"Broken pipe|Connection (?:reset|refused|closed)|connection was likely closed|"
                         r"Failed to recv|Failed to send|Socket Timeout", re.IGNORECASE)


def connection_lost(exc: BaseException) -> bool:
    """True when a store call failed because its connection did (the server's host crashed, its
    process exited): torch raises ``DistNetworkError`` (or a bare ``RuntimeError`` in older builds)
    and the call would fail the same way again, unlike a refused operation."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"DistNetworkError", "ConnectionError"}) or bool(_LOST_WORDS.search(str(exc)))


class StoreBackoff:
    """After ``threshold`` failures in a row, wait ``base_s``, then twice as long each time, up to ``cap_s``.

    A TCPStore client whose server is gone prints a ~15-line C++ warning on every call;
    polling it every second from every rank floods the job's stderr. With back-off the
    store is tried a handful of times a minute at most, and the agent says so once.
    """

    def __init__(self, threshold: int = 3, base_s: float = 2.0, cap_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold, self.base_s, self.cap_s, self._clock = threshold, base_s, cap_s, clock
        self.failures = 0
        self.retry_at = 0.0
        self._said = False

    def allow(self) -> bool:
        """True when a store call may be tried now."""
        return self.failures < self.threshold or self._clock() >= self.retry_at

    def success(self) -> None:
        if self._said:
            log.warning("the job's store answers again after %d failed calls; incidents are back on", self.failures)
        self.failures, self.retry_at, self._said = 0, 0.0, False

    def failure(self, exc: BaseException) -> None:
        self.failures += 1
        if self.failures < self.threshold:
            return
        wait = min(self.cap_s, self.base_s * 2 ** (self.failures - self.threshold))
        self.retry_at = self._clock() + wait
        if not self._said:
            self._said = True
            log.warning("the job's store failed %d times in a row (%s: %s); backing off (up to %gs between tries), "
                        "incidents paused; training is not affected", self.failures, type(exc).__name__,
                        one_line(exc, 160), self.cap_s)


_Call = tuple[Callable[[], Any], "Future[Any]"]


class StoreLink:
    """Runs store calls on one worker thread; each caller waits a bounded time for its answer."""

    def __init__(self, timeout_s: float = STORE_TIMEOUT_S, backoff: StoreBackoff | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.backoff = backoff if backoff is not None else StoreBackoff(clock=clock)
        self._clock = clock
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._busy_since: float | None = None  # monotonic start of the call the worker is in
        self._state = threading.Lock()
        self._deadline = threading.local()
        self._announce = threading.local()
        self._worker: threading.Thread | None = None
        #: Wall clock (ns) since which the store has not answered; None while it answers.
        self.unreachable_since_ns: int | None = None
        #: How log lines name the store (``host:port``).
        self.name = "the job's store"

    # -- bounds ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def deadline(self, at: float) -> Iterator[None]:
        """Calls from this thread end by monotonic time ``at`` (the exit path's budget), whatever their timeout."""
        before = getattr(self._deadline, "at", None)
        self._deadline.at = at if before is None else min(before, at)
        try:
            yield
        finally:
            self._deadline.at = before

    def current_deadline(self) -> float | None:
        """The calling thread's deadline (monotonic), if any: a helper thread it starts takes it along."""
        return getattr(self._deadline, "at", None)

    @contextlib.contextmanager
    def announcing(self, before: Callable[[float], None]) -> Iterator[None]:
        """Calls from this thread first tell ``before`` the longest they may wait (seconds): a node leader
        says so on its board, so that its ranks do not take a slow store call for a lost leader."""
        outer = getattr(self._announce, "before", None)
        self._announce.before = before
        try:
            yield
        finally:
            self._announce.before = outer

    def reachable(self) -> bool:
        """False while the worker is stuck in an unanswered call or the back-off says wait."""
        return not self._stuck() and self.backoff.allow()

    def unreachable_for_s(self) -> float:
        """Seconds the store has not answered (0 while it answers)."""
        since = self.unreachable_since_ns
        return max(0.0, (time.time_ns() - since) / 1e9) if since is not None else 0.0

    def _stuck(self) -> bool:
        busy = self._busy_since
        return busy is not None and self._clock() - busy > self.timeout_s

    # -- calls ----------------------------------------------------------------------------
    def call(self, fn: Callable[[], Any], what: str, timeout_s: float | None = None) -> Any:
        """``fn()`` (one store operation) on the worker; its result, or :class:`StoreUnavailable`
        when it does not answer within ``timeout_s`` (default: the link's) or the caller's deadline.
        An exception the store raises is re-raised as is."""
        if self._stuck():
            raise StoreUnavailable(f"{what}: the store has not answered for {self.unreachable_for_s():.0f} s")
        if not self.backoff.allow():
            raise StoreUnavailable(f"{what}: the job's store is unreachable; backing off")
        full = self.timeout_s if timeout_s is None else timeout_s
        at = self.current_deadline()
        wait = full if at is None else min(full, at - self._clock())
        if wait <= 0:
            raise StoreUnavailable(f"{what}: no time left")
        before = getattr(self._announce, "before", None)
        if before is not None:
            before(wait)
        future: Future[Any] = Future()
        self._ensure_worker()
        self._calls.put((fn, future))
        try:
            result = future.result(timeout=wait)
        except FutureTimeout:
            never_ran = future.cancel()  # still queued behind another call: the worker skips it
            if never_ran and wait < full:
                # The caller's own deadline ran out while other calls had the worker: no word on the store.
                raise StoreUnavailable(f"{what}: no time left (queued behind other calls)") from None
            exc = StoreUnavailable(f"{what}: no answer from the store within {wait:.1f} s")
            if self.unreachable_since_ns is None and wait >= self.timeout_s:
                log.warning("%s did not answer within %.0f s (its host lost or cut off?): incidents go on without "
                            "it, each node reporting its own part; training is not affected", self.name, wait)
            self._failed(exc)
            raise exc from None
        except Exception as exc:
            self._failed(exc)
            if connection_lost(exc):  # the store's host went away: the same as no answer, for every caller
                raise StoreUnavailable(f"{what}: {type(exc).__name__}: {one_line(exc, 160)}") from exc
            raise
        self.backoff.success()
        self.unreachable_since_ns = None
        return result

    def _failed(self, exc: BaseException) -> None:
        self.backoff.failure(exc)
        if self.unreachable_since_ns is None:
            self.unreachable_since_ns = time.time_ns()

    def _ensure_worker(self) -> None:
        with self._state:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="fr-otel-store", daemon=True)
                self._worker.start()

    def _work(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            self._busy_since = self._clock()
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                self._busy_since = None

    def close(self) -> None:
        """Let the worker end after the calls already queued (it may be stuck: it is never joined)."""
        self._calls.put(None)


class LinkedStore:
    """A store whose every method call goes through a :class:`StoreLink` (bounded; same results)."""

    def __init__(self, store: Any, link: StoreLink) -> None:
        self._store, self._link = store, link

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._link.call(lambda: attr(*args, **kwargs), name)

        return call
