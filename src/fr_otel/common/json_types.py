"""Type checks for values parsed from untrusted JSON (payloads, side files, incident attributes).

``type(v) is int`` rather than ``isinstance``: a bool is an int to Python but never a count or
a time here. As ``TypeGuard``s, the checks also tell the type checker what passed them.
"""

from __future__ import annotations

from typing import TypeGuard

__all__ = ["is_exact_int", "is_exact_number"]


def is_exact_int(value: object) -> TypeGuard[int]:
    """An ``int`` proper (not a bool)."""
    return type(value) is int


def is_exact_number(value: object) -> TypeGuard[int | float]:
    """An ``int`` or ``float`` proper (not a bool)."""
    return type(value) in (int, float)
