"""Rank sets as short text (``0-7,9,12-15``), so output stays readable at 1000 ranks."""

from __future__ import annotations

from typing import Iterable

__all__ = ["compress_ranks"]


def compress_ranks(ranks: Iterable[int], *, limit: int = 12) -> str:
    """``[0, 1, 2, 3, 5, 9, 10]`` -> ``"0-3,5,9-10"``; past ``limit`` runs, ``"… (+N more)"``."""
    ordered = sorted(set(ranks))
    runs: list[tuple[int, int]] = []
    for r in ordered:
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if len(parts) > limit:
        hidden = sum(b - a + 1 for a, b in runs[limit:])
        parts = parts[:limit] + [f"… (+{hidden} more)"]
    return ",".join(parts)
