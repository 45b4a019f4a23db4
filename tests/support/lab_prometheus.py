"""A real Prometheus inside a lab host, queried from the test through a thread that lives there.

The lab's addresses (10.213.0.x) exist only inside its namespaces, so a Prometheus that scrapes
the ranks must run in one. Network namespaces are per thread on Linux: one worker thread enters
host ``node``'s namespace (``setns``) and makes every call of :class:`support.prometheus.
PrometheusServer` there, so the server it forks runs in that namespace, listens on that host's
loopback, and the HTTP queries reach it. Nothing else of the test process changes namespace.

    with LabPrometheus(lab, 0, targets, rule_files=[rules]) as prom:
        prom.wait_for_targets(up=6)
        prom.query('ALERTS{alertstate="firing"}')
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from support.prometheus import Exemplar, PrometheusServer, Sample
from support.lab_ns import NETNS_RUN

if TYPE_CHECKING:
    from support.lab import Lab

__all__ = ["LabPrometheus", "in_namespace"]

_CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def _enter(ns: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(ns, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def in_namespace(ns: Path) -> ThreadPoolExecutor:
    """One worker thread that has entered the network namespace ``ns`` (shut it down when done)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="lab-netns", initializer=_enter, initargs=(ns,))


class LabPrometheus:
    """A :class:`PrometheusServer` on lab host ``node``; every call goes through that host's thread."""

    def __init__(self, lab: Lab, node: int, targets: Sequence[str], **options: Any) -> None:
        self._thread = in_namespace(NETNS_RUN / lab.namespaces[node])
        self.server = PrometheusServer(targets, **options)

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._thread.submit(fn, *args, **kwargs).result()

    def __enter__(self) -> LabPrometheus:
        try:
            self._call(self.server.start)
        except BaseException:
            self._thread.shutdown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._call(self.server.stop)
        finally:
            self._thread.shutdown()

    def query(self, expr: str) -> list[Sample]:
        return self._call(self.server.query, expr)

    def exemplars(self, expr: str, start: float, end: float) -> list[Exemplar]:
        return self._call(self.server.exemplars, expr, start, end)

    def history(self, expr: str, since: float, step: float = 5.0) -> str:
        """``expr``'s series from ``since`` to now, one line each (for a failure to explain itself)."""
        rows = self._call(self.server.query_range, expr, since, time.time(), step)
        return "\n".join(f"{expr}{labels}: " + " ".join(f"{t - since:.0f}s={v:.3g}" for t, v in values)
                         for labels, values in rows) or f"{expr}: no series"

    def wait_for_targets(self, up: int | None = None, timeout: float = 30.0) -> list[dict[str, Any]]:
        return self._call(self.server.wait_for_targets, up, timeout)

    def firing(self, alert_regex: str) -> list[dict[str, str]]:
        """The labels of every firing alert whose name matches ``alert_regex``."""
        return [s.labels for s in self.query(f'ALERTS{{alertname=~"{alert_regex}",alertstate="firing"}}')]

    def log_tail(self) -> str:
        return self.server.log_tail()
