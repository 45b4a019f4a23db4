"""Serve ``/metrics`` for one rank on ``base port + LOCAL_RANK``; a taken port is a log line.

prometheus_client's own server (a daemon thread) with a registry holding only the fr-otel
collector, so this port shows the same series whatever else the application registers.
It negotiates OpenMetrics (needed for exemplars) with Prometheus by ``Accept`` header.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

__all__ = ["MetricsServer", "local_rank", "port_for", "start_metrics_server"]

log = logging.getLogger("fr_otel.agent")


def local_rank(environ: dict[str, str] | None = None) -> int | None:
    """LOCAL_RANK (torchrun), else SLURM_LOCALID; None when neither says."""
    env = os.environ if environ is None else environ
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        raw = env.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


def port_for(base: int, local: int | None) -> int:
    """``base + local rank``; 0 stays 0 (any free port)."""
    return 0 if base == 0 else base + (local or 0)


@dataclass(slots=True)
class MetricsServer:
    """A running ``/metrics`` endpoint."""

    addr: str
    port: int
    _httpd: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.addr in ("", "0.0.0.0") else ("[::1]" if self.addr == "::" else self.addr)
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(collector: Collector, port: int, addr: str = "0.0.0.0") -> MetricsServer | None:
    """Serve ``collector`` on ``addr:port``; None (after one warning) when that fails."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        httpd, thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        log.warning("cannot serve /metrics on %s:%d (%s); this rank's metrics are off, training continues. "
                    "Pick another base port with FR_OTEL_METRICS_PORT.", addr, port, exc.strerror or exc)
        return None
    thread.name = "fr-otel-metrics"
    bound = int(httpd.server_address[1])
    return MetricsServer(addr=addr, port=bound, _httpd=httpd, _thread=thread)
