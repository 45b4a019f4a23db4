"""Epoch times as people read them in a verdict: ``10:41:03.218 UTC``, one format everywhere."""

from __future__ import annotations

from datetime import datetime, timezone

__all__ = ["format_clock"]


def format_clock(ns: int) -> str:
    """Epoch ns as ``10:41:03.218 UTC``."""
    t = datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    return t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d} UTC"
