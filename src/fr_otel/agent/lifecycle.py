"""This process's one agent: start it (settings, log, the recorder's size, export settings), stop it, flush it.

:func:`start` is what ``fr_otel.start()``, ``fr_otel.agent.start()`` and the ``fr-otel run``
bootstrap call; it never raises into the training script. The agent itself is
:class:`fr_otel.agent.core.Agent`, imported only when one starts.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from ..common.log import logger
from .config import FR_OTEL_AUTOSTART, AgentConfig, resolve_config
from .logs import configure_logging
from .observe.recorder import prepare_recorder

if TYPE_CHECKING:
    from ..otlp.config import ExportConfig

__all__ = ["current", "export_config_for", "flush", "start", "stop"]

log = logger("fr_otel.agent")

_lock = threading.Lock()
_agent: Any = None  # core.Agent, imported lazily


def start(**options: Any) -> Any:
    """Start this process's agent (idempotent); returns it, or None when disabled or failing.

    Options are those of :data:`fr_otel.agent.config.OPTIONS` (e.g. ``poll_interval``,
    ``stall_seconds``, ``metrics_port``, ``metrics_addr``, ``recorder_capacity``,
    ``dump_dir``, ``out_dir``, ``job_id``, ``hooks``), plus OTLP overrides ``endpoint``,
    ``protocol``, ``headers``, ``export_timeout``. Never raises. In a launcher (torchrun,
    ``torch.distributed.run``) it starts nothing: the ranks it starts run their own.
    """
    global _agent
    try:
        with _lock:
            if _agent is not None and _agent.running and _agent.pid == os.getpid():
                return _agent
            from .core import Agent  # loaded only when an agent starts
            from .guest.role import in_launcher

            config, problems = resolve_config(options)
            configure_logging(config.log_level)
            for line in problems:
                log.warning("setting %s", line)
            if not config.enabled or in_launcher():
                return None
            prepare_recorder(config)
            agent = Agent(config, export_config_for(config))
            agent.start()  # claims FR_OTEL_AGENT_PID once this process has a process group
            _agent = agent
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


def export_config_for(config: AgentConfig) -> ExportConfig:
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
