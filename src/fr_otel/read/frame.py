"""One Python stack frame: what a dump entry's call site and a live thread stack are made of.

Its own module so both :mod:`fr_otel.read.dump` (entries) and :mod:`fr_otel.read.live_stack`
(threads at incident time) stand on it without importing each other.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Frame"]


class Frame(NamedTuple):
    """One Python stack frame of the call that enqueued a collective."""

    name: str
    filename: str
    line: int
