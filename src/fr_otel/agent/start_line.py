"""The agent's one start-up line: what it serves where, and where an incident's dumps and trace go.

It is how a user checks the agent is on (one line per host, from local rank 0), so it says
the real addresses and folders, absolute, and what would raise an incident.
"""

from __future__ import annotations

import os

from ..incident.delivery import out_dir
from ..otlp.config import ExportConfig
from .config import AgentConfig
from .incident.rank import dump_root
from .serve.server import MetricsServer, local_rank

__all__ = ["start_line"]


def start_line(config: AgentConfig, export: ExportConfig, who: str, server: MetricsServer | None,
               host: str | None, *, incidents: bool) -> str:
    """``agent on (rank 0 of 8): /metrics on …; a collective in flight over 60 s … raises an incident: …``."""
    local = local_rank()
    if config.metrics_port is None:
        metrics = "/metrics off"
    elif server is None:
        metrics = "/metrics NOT served (see above)"
    else:
        metrics = _served_at(server, host)
        if config.metrics_port and local is not None:
            metrics += f"; this host's ranks on port {config.metrics_port} + LOCAL_RANK"
    if not incidents:
        return f"agent on ({who}): {metrics}; incidents off"
    if export.disabled:
        trace = "no trace (OTEL_SDK_DISABLED)"
    elif export.endpoint is None:
        trace = f"trace as OTLP JSON in {os.path.abspath(out_dir(config.out_dir))}/ (no OTLP endpoint set)"
    else:
        trace = f"trace to {export.shown_target()} ({export.protocol})"
    return (f"agent on ({who}): {metrics}; a collective in flight over {config.stall_seconds:g} s (or half its "
            f"timeout) raises an incident: dumps in {os.path.abspath(dump_root(config))}/, {trace}")


def _served_at(server: MetricsServer, host: str | None) -> str:
    """Where ``/metrics`` really listens: every interface (with this host's name, the address a
    Prometheus elsewhere scrapes) or the one address it was bound to."""
    if server.addr in ("", "0.0.0.0", "::"):
        where = f"http://{host}:{server.port}/metrics" if host else f"port {server.port}"
        return f"/metrics on all interfaces ({server.addr or '0.0.0.0'}:{server.port}): {where}"
    return f"/metrics at {server.url}"
