"""The agent's counters and its one rule for failures: count, log rarely, never raise.

Everything the agent does runs inside :meth:`HealthTracker.guard`. An exception there
becomes ``fr_agent_errors_total`` + one log line per kind of failure and minute, and the
training thread never sees it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...common.log import logger
from ...common.text import one_line
from ..observe.state import Health

__all__ = ["LOG_EVERY_S", "HealthTracker", "run_guarded"]

LOG_EVERY_S = 60.0

log = logger("fr_otel.agent")


class HealthTracker:
    """Thread-safe counters behind the ``fr_agent_*`` metrics, and rate-limited error logs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._health = Health()
        self._last_logged: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def snapshot(self) -> Health:
        with self._lock:
            return self._health

    def polled(self) -> None:
        with self._lock:
            h = self._health
            self._health = _replace(h, polls=h.polls + 1, last_poll_s=time.time())

    def export_failed(self) -> None:
        with self._lock:
            self._health = _replace(self._health, export_failures=self._health.export_failures + 1)

    def incident(self, trace_id_hex: str) -> None:
        with self._lock:
            h = self._health
            self._health = _replace(h, incidents=h.incidents + 1, last_incident_trace_id=trace_id_hex,
                                    last_incident_s=time.time())

    def exclude(self, k: int, hosts: tuple[str, ...]) -> None:
        """Incident ``k``, concluded here, says a restart should leave ``hosts`` out (``fr_exclude_host``)."""
        with self._lock:
            self._health = _replace(self._health, exclude_hosts=hosts, exclude_incident=k)

    def error(self, where: str, exc: BaseException | str, *, level: int = logging.WARNING) -> None:
        """Count one failure; log it unless this kind was logged less than a minute ago."""
        with self._lock:
            self._health = _replace(self._health, errors=self._health.errors + 1)
            now = time.monotonic()
            last = self._last_logged.get(where)
            if last is not None and now - last < LOG_EVERY_S:
                self._suppressed[where] = self._suppressed.get(where, 0) + 1
                return
            self._last_logged[where] = now
            skipped = self._suppressed.pop(where, 0)
        what = exc if isinstance(exc, str) else f"{type(exc).__name__}: {one_line(exc)}"
        more = f" ({skipped} more since the last report)" if skipped else ""
        log.log(level, "agent error in %s (training is not affected): %s%s", where, what, more)

    @contextlib.contextmanager
    def guard(self, where: str, *, level: int = logging.WARNING) -> Iterator[None]:
        """Run a block; any exception is counted and logged, never propagated."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - the whole point: nothing reaches training
            self.error(where, exc, level=level)


def run_guarded(health: HealthTracker, where: str, target: Callable[..., Any], *args: Any) -> None:
    """A thread's whole body under the guard (``threading.Thread(target=run_guarded, ...)``): whatever
    escapes ``target`` is a counted log line, not a traceback on the job's stderr and a silently dead thread."""
    with health.guard(where):
        target(*args)


def _replace(h: Health, **changes: Any) -> Health:
    return dataclasses.replace(h, **changes)


