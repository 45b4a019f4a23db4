"""One-line messages: every problem fr-otel reports is a single line, never a traceback."""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(value: object, limit: int = 300) -> str:
    """``value`` (text or an exception) flattened to one line of at most ``limit`` characters."""
    if isinstance(value, BaseException):
        value = str(value) or type(value).__name__
    flat = " ".join(str(value).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
