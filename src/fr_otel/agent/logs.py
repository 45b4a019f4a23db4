"""The agent's own stderr log, each line prefixed with the rank.

A library's ``NullHandler`` would swallow the agent's warnings, and a training job's stderr
is where its operators look: the ``fr_otel.agent`` logger gets one handler of its own.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, TextIO

from ..common.text import PrintableFormatter

__all__ = ["configure_logging", "set_log_rank"]


class _RankFilter(logging.Filter):
    """Prefixes the agent's log lines with the rank once it is known."""

    rank = os.environ.get("RANK", "?")

    def filter(self, record: logging.LogRecord) -> bool:
        record.fr_rank = _RankFilter.rank
        return True


def set_log_rank(rank: int) -> None:
    """The rank the agent's lines name from now on (``RANK`` until the process group exists)."""
    _RankFilter.rank = str(rank)


if TYPE_CHECKING:
    _StreamHandler = logging.StreamHandler[TextIO]
else:  # generic in typeshed only (Python 3.10 cannot subscript it)
    _StreamHandler = logging.StreamHandler


class _AgentHandler(_StreamHandler):
    """The agent's own stderr handler: configuring twice must not add a second one."""


def configure_logging(level: str) -> None:
    """The agent logs to stderr itself (a library's NullHandler would swallow its warnings)."""
    logger = logging.getLogger("fr_otel.agent")
    logger.setLevel(level.upper())
    if not any(isinstance(h, _AgentHandler) for h in logger.handlers):
        handler = _AgentHandler()
        # At debug level each line carries its time: what the agent did when, around an incident. In front, so
        # that the prefix people grep for (`fr-otel[rank N]: incident`) is the same at every level.
        stamp = "%(asctime)s " if level.lower() == "debug" else ""
        handler.setFormatter(PrintableFormatter(f"{stamp}fr-otel[rank %(fr_rank)s]: %(message)s"))
        handler.addFilter(_RankFilter())
        logger.addHandler(handler)
        logger.propagate = False
