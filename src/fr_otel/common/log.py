"""The package's loggers, with the library convention: a ``NullHandler`` on ``fr_otel``.

A library logs and the application decides where it goes; without a handler of its own a
warning would reach stderr through logging's last resort. The handler is added here, by the
first module that logs, not by the package root: ``import fr_otel`` and ``fr-otel --version``
need not import logging (most of their start-up after the interpreter's own).
"""

from __future__ import annotations

import logging

__all__ = ["ROOT_LOGGER", "logger"]

ROOT_LOGGER = "fr_otel"

logging.getLogger(ROOT_LOGGER).addHandler(logging.NullHandler())


def logger(name: str = ROOT_LOGGER) -> logging.Logger:
    """``logging.getLogger(name)`` for a name under ``fr_otel``, once the package's handler is in place."""
    return logging.getLogger(name)
