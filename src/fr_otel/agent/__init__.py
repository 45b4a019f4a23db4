"""The live agent: Flight Recorder progress as Prometheus metrics, hangs as one trace, in-process.

Usage, one line anywhere in the training script (before or after ``init_process_group``;
calling it again returns the running agent)::

    import fr_otel
    fr_otel.start()                       # or fr_otel.start(stall_seconds=120, metrics_port=9740)

or with no code change at all::

    fr-otel run --stall-seconds 120 -- torchrun --nproc-per-node 8 train.py

Each rank then serves ``/metrics`` on ``9740 + LOCAL_RANK`` (the ``fr_*`` series:
in-flight age and timeout per group, last enqueued/completed sequence numbers, incidents,
agent health); when a collective has been in flight longer than min(``stall_seconds``,
half its timeout), the rank that sees it raises an incident through the job's own store,
every rank writes its recorder to ``fr-otel-out/dumps/<trace id>/fr_trace_rank_<rank>``,
and the raiser exports one OpenTelemetry trace with the verdict as its root (standard
``OTEL_EXPORTER_OTLP_*`` configuration; without an endpoint, an OTLP JSON file). The same
happens, bounded, on an uncaught exception or SIGTERM.

Settings: arguments > ``FR_OTEL_*`` variables > defaults (:mod:`fr_otel.agent.config`).
Nothing here raises into the training script: failures are counted
(``fr_agent_errors_total``) and logged to stderr, rarely. See ``docs/agent.md``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from .config import FR_OTEL_AGENT_PID, FR_OTEL_AUTOSTART, AgentConfig, resolve_config

__all__ = ["AgentConfig", "current", "flush", "start", "stop"]

log = logging.getLogger("fr_otel.agent")

_lock = threading.Lock()
_agent: Any = None  # core.Agent, imported lazily


def start(**options: Any) -> Any:
    """Start this process's agent (idempotent); returns it, or None when disabled or failing.

    Options are those of :data:`fr_otel.agent.config.OPTIONS` (e.g. ``poll_interval``,
    ``stall_seconds``, ``metrics_port``, ``metrics_addr``, ``recorder_capacity``,
    ``dump_dir``, ``out_dir``, ``job_id``, ``hooks``), plus OTLP overrides ``endpoint``,
    ``protocol``, ``headers``, ``export_timeout``. Never raises.
    """
    global _agent
    try:
        with _lock:
            if _agent is not None and _agent.running and _agent.pid == os.getpid():
                return _agent
            from .core import Agent, configure_logging

            config, problems = resolve_config(options)
            configure_logging(config.log_level)
            for line in problems:
                log.warning("setting %s", line)
            if not config.enabled:
                return None
            _prepare_recorder(config)
            agent = Agent(config, _export_config(config))
            agent.start()
            _agent = agent
            os.environ[FR_OTEL_AGENT_PID] = str(os.getpid())
            return agent
    except Exception as exc:  # noqa: BLE001 - one line, and training goes on
        log.warning("the fr-otel agent could not start (training is not affected): %s: %s", type(exc).__name__, exc)
        return None


def stop() -> None:
    """Stop the agent (threads, /metrics, hooks) without flushing; start() may start it again."""
    global _agent
    with _lock:
        agent, _agent = _agent, None
    if agent is not None:
        try:
            agent.stop()
        except Exception as exc:  # noqa: BLE001
            log.warning("stopping the fr-otel agent: %s: %s", type(exc).__name__, exc)


def flush(reason: str = "manual", timeout: float | None = None) -> bool:
    """Raise an incident now (or join the open one): every rank writes its recorder and the
    raiser exports the trace. Waits at most ``timeout`` (default ``flush_timeout``)."""
    agent = _agent
    if agent is None:
        return False
    try:
        return bool(agent.flush(reason, timeout))
    except Exception as exc:  # noqa: BLE001
        log.warning("fr-otel flush failed: %s: %s", type(exc).__name__, exc)
        return False


def current() -> Any:
    """The running agent of this process, or None."""
    return _agent


def _export_config(config: AgentConfig) -> Any:
    """The OTLP settings; a bad inherited timeout or insecure flag falls back to its default
    (still exporting), an unusable setting to the local file. Said once: by ``fr-otel run``
    at launch when it started this rank, else here."""
    from ..otlp.config import resolve_export_config

    level = logging.DEBUG if os.environ.get(FR_OTEL_AUTOSTART) == "1" else logging.WARNING
    warnings: list[str] = []
    try:
        resolved = resolve_export_config(endpoint=config.endpoint, protocol=config.protocol, headers=config.headers,
                                         timeout_s=config.export_timeout, warnings=warnings)
    except ValueError as exc:
        log.log(level, "OTLP export setting: %s; incident traces go to a local file instead", exc)
        return resolve_export_config(environ={})
    for line in warnings:
        log.log(level, "OTLP export setting: %s", line)
    return resolved


def _prepare_recorder(config: AgentConfig) -> None:
    """Before the process group exists, the recorder's size is still ours to set."""
    from .core import warn_recorder_off
    from .recorder import (
        BUFFER_SIZE_ENV,
        DEFAULT_CAPACITY,
        OLD_BUFFER_SIZE_ENV,
        process_group_ready,
        recorder_capacity,
    )

    current_capacity = recorder_capacity()
    if process_group_ready() is not None:
        if config.recorder_capacity is not None and config.recorder_capacity != current_capacity:
            log.warning("recorder_capacity=%d ignored: the process group exists already, the recorder holds %d "
                        "entries", config.recorder_capacity, current_capacity)
        return  # a recorder that is off is reported when the agent gets ready
    wanted: int | None = config.recorder_capacity
    if wanted is None and current_capacity <= 0:
        if not config.enable_recorder:
            warn_recorder_off(too_late=False)
            return
        wanted = DEFAULT_CAPACITY
        log.warning("the PyTorch Flight Recorder was OFF (TORCH_FR_BUFFER_SIZE=0): fr-otel turned it on with %d "
                    "entries (FR_OTEL_ENABLE_RECORDER=false keeps it off)", wanted)
    if wanted is not None:
        os.environ[BUFFER_SIZE_ENV] = str(wanted)
        if OLD_BUFFER_SIZE_ENV in os.environ:
            os.environ[OLD_BUFFER_SIZE_ENV] = str(wanted)
