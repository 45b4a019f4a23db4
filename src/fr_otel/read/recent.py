"""The one rule for which recorder entries matter beyond the moment: per group the last N, plus every op in flight.

A hang is read from what is still in flight and from the last few collectives before it;
older completed history only costs bytes. The agent trims what a rank sends its
coordinator with it (torch's raw entry dicts) and a focused trace picks its spans with it
(:class:`~fr_otel.read.dump.Entry`), so both keep the same entries.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

__all__ = ["recent_and_in_flight"]

T = TypeVar("T")


def recent_and_in_flight(
    entries: Sequence[T],
    keep: int,
    group_of: Callable[[T], Hashable | None],
    completed: Callable[[T], bool],
    also: Callable[[T], bool] | None = None,
) -> list[T]:
    """Per group, the last ``keep`` entries plus every one not ``completed`` (and every one
    ``also`` names); record order kept. An entry whose group is ``None`` (unreadable) is left out."""
    seen: dict[Hashable, int] = {}
    flags = [False] * len(entries)
    for i in range(len(entries) - 1, -1, -1):
        e = entries[i]
        group = group_of(e)
        if group is None:
            continue
        n = seen.get(group, 0)
        if n < keep or not completed(e) or (also is not None and also(e)):
            flags[i] = True
        seen[group] = n + 1
    return [e for e, f in zip(entries, flags) if f]
