"""Who stopped first, as the verdict says it: the culprits' stop times or, undated, their progress.

Plain data and its sentences (:meth:`StopOrder.lines`, one short clause a line); the ordering
itself is :mod:`.stop_order`'s. :mod:`.verdict` carries a :class:`StopOrder` and re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..common.clock import format_clock
from ..common.ranks import compress_ranks

__all__ = ["StopOrder", "StopPoint"]


@dataclass(frozen=True, slots=True)
class StopPoint:
    """How far an undated culprit got: its last enqueued collective in its blamed group, and
    the earliest time (its peers' clocks) a peer enqueued the next one, which it never did."""

    rank: int
    group: str
    label: str  # the group's human name
    desc: str
    last_enqueued: int
    before_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "process_group": {"name": self.group, "desc": self.desc},
                "last_enqueued": self.last_enqueued, "before_ns": self.before_ns}


@dataclass(frozen=True, slots=True)
class StopOrder:
    """Culprits by when they stopped: ``ranks`` first-to-stop first when ``ordered``."""

    ranks: tuple[int, ...]
    stopped_ns: dict[int, int] = field(default_factory=dict)  # rank -> last activity, its own clock
    ordered: bool = False
    note: str | None = None  # why the order is not known
    points: tuple[StopPoint, ...] = ()  # culprits' progress, when their stops are undated
    same_point: bool = False  # undated culprits all stopped after the same collective
    program_first: int | None = None  # the undated culprit that got least far (program order)

    @property
    def first(self) -> int | None:
        return self.ranks[0] if self.ordered and self.ranks else None

    def delay_s(self, rank: int) -> float | None:
        """Seconds after the first culprit stopped (None when not ordered)."""
        if not self.ordered or rank not in self.stopped_ns or self.first is None:
            return None
        return (self.stopped_ns[rank] - self.stopped_ns[self.first]) / 1e9

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "ordered": self.ordered, "first": self.first, "note": self.note,
                "same_point": self.same_point, "program_first": self.program_first,
                "points": [p.to_dict() for p in self.points]}

    def sentence(self) -> str:
        """:meth:`lines` as one string (the trace's attribute, the agent's log line)."""
        return "; ".join(self.lines())

    def lines(self) -> list[str]:
        """Who stopped first, one short clause a line: ``rank 9 stopped first, 10:41:03.218 UTC;
        rank 14 0.410 s later``, or why that is unknown and what is known instead."""
        if self.points and (self.same_point or self.program_first is not None):
            return self._progress_lines()
        if not self.ordered or not self.ranks:
            return [f"order of stopping unknown: {self.note}"] if self.note else []
        first = self.ranks[0]
        text = f"rank {first} stopped first, {format_clock(self.stopped_ns[first])}"
        if len(self.ranks) == 1:
            return [f"{text} (the only culprit)"]
        later = [f"rank {r} {self.delay_s(r):.3f} s later" for r in self.ranks[1:6]]
        if len(self.ranks) > 6:
            later.append(f"… {len(self.ranks) - 6} more")
        return ["; ".join([text, *later])]

    def _progress_lines(self) -> list[str]:
        """Undated culprits placed by progress: the same point, or who got least far; with time bounds."""
        pts = self.points
        if self.same_point:
            names = sorted({p.group for p in pts}, key=lambda n: (len(n), n))
            where = pts[0].label if len(names) == 1 else f"{pts[0].desc} ({', '.join(names[:6])})"
            out = [f"{_rank_list([p.rank for p in pts])} stopped at the same point: last enqueued "
                   f"#{pts[0].last_enqueued} on {where}",
                   "which stopped first is unknown: no recorded activity dates their stops"]
        else:
            first = next(p for p in pts if p.rank == self.program_first)
            out = [f"rank {first.rank} stopped first in program order: its last enqueued is #{first.last_enqueued} "
                   f"on {first.label}"]
            out += [f"rank {p.rank} got further: #{p.last_enqueued} on {p.label}" for p in pts if p.rank != first.rank]
            out.append("no recorded activity dates the stops")
        bounds = [(p, p.before_ns) for p in pts if p.before_ns]
        if not bounds:
            return out
        clocks = {_clock_after(before) for _, before in bounds}
        nexts = {p.last_enqueued + 1 for p, _ in bounds}
        if len(clocks) == 1 and len(bounds) == len(pts) and len(nexts) == 1:
            everyone = "both" if len(pts) == 2 else ("all" if len(pts) > 1 else f"rank {pts[0].rank}")
            return [*out, f"{everyone} stopped before {clocks.pop()}, when their peers entered #{nexts.pop()} "
                          "(peers' clocks)"]
        return [*out, *(f"rank {p.rank} stopped before {_clock_after(before)}, when its peers "
                        f"entered #{p.last_enqueued + 1} on {p.label} (peers' clocks)" for p, before in bounds[:6])]


def _rank_list(ranks: list[int]) -> str:
    """``ranks 9 and 14`` / ``ranks 1,3-5``."""
    if len(ranks) == 2:
        return f"ranks {ranks[0]} and {ranks[1]}"
    return f"ranks {compress_ranks(ranks)}" if len(ranks) > 1 else f"rank {ranks[0]}"


def _clock_after(ns: int) -> str:
    """A bound "before ``ns``" in ms, rounded up so it never claims more than is known."""
    return format_clock(-(-ns // 1_000_000) * 1_000_000)
