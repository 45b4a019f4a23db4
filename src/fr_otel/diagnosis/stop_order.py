"""Which culprit stopped first, and whether the clocks allow saying so.

A culprit stopped making progress at its last recorded activity (latest enqueue or
completion) in the groups where it is blamed. Those times come from each rank's own
clock, so two culprits on different hosts (or hosts unknown) are compared only when their
clocks are shown to agree: in the collectives both completed, their enqueue times must
differ by less than the gap between their stops (any clock offset, plus ordinary arrival
jitter, shows there). Otherwise the answer is "cannot order", never a guess.

Culprits that left no timestamps (their ring holds nothing of the stuck groups) are
placed by progress instead: one that enqueued fewer collectives, in a group both
belong to or in parallel groups of one kind (every TENSOR_MODEL_PARALLEL_GROUP runs
the same sequence), stopped first in program order; equal progress is "the same
point", bounded in time by when their peers enqueued the collective they never reached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..common.ranks import compress_ranks
from .job import Job
from .verdict import Culprit

__all__ = ["StopOrder", "StopPoint", "format_clock", "order_stops"]

_RECENT = 256  # most recent shared collectives that judge two ranks' clocks


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
        return {"rank": self.rank, "process_group": self.group, "last_enqueued": self.last_enqueued,
                "before_ns": self.before_ns}


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
        """``rank 9 stopped first, 10:41:03.218 UTC; rank 14 0.410 s later`` (or why not)."""
        if self.points and (self.same_point or self.program_first is not None):
            return self.progress_sentence()
        if not self.ordered or not self.ranks:
            return f"order of stopping unknown: {self.note}" if self.note else ""
        first = self.ranks[0]
        text = f"rank {first} stopped first, {format_clock(self.stopped_ns[first])}"
        if len(self.ranks) == 1:
            return f"{text} (the only culprit)"
        later = [f"rank {r} {self.delay_s(r):.3f} s later" for r in self.ranks[1:6]]
        if len(self.ranks) > 6:
            later.append(f"… {len(self.ranks) - 6} more")
        return "; ".join([text, *later])


    def progress_sentence(self) -> str:
        """Undated culprits placed by progress: the same point, or who got least far; with time bounds."""
        pts = self.points
        by_rank = {p.rank: p for p in pts}
        if self.same_point:
            names = sorted({p.group for p in pts}, key=lambda n: (len(n), n))
            where = pts[0].label if len(names) == 1 else f"{pts[0].desc} ({', '.join(names[:6])})"
            who = _rank_list([p.rank for p in pts])
            text = (f"{who} stopped at the same point: last enqueued #{pts[0].last_enqueued} on {where}; "
                    "which stopped first is unknown (no recorded activity dates their stop)")
        else:
            first = by_rank[self.program_first]  # type: ignore[index]
            others = "; ".join(f"rank {p.rank} #{p.last_enqueued} on {p.label}" for p in pts
                               if p.rank != first.rank)
            text = (f"rank {first.rank} stopped first in program order: its last enqueued is #{first.last_enqueued} "
                    f"on {first.label}, the others got further ({others}); no recorded activity dates the stops")
        bounds = [p for p in pts if p.before_ns]
        if not bounds:
            return text
        clocks = {_clock_after(p.before_ns) for p in bounds}  # type: ignore[arg-type]
        nexts = {p.last_enqueued + 1 for p in bounds}
        if len(clocks) == 1 and len(bounds) == len(pts) and len(nexts) == 1:
            everyone = "both" if len(pts) == 2 else ("all" if len(pts) > 1 else f"rank {pts[0].rank}")
            return (f"{text}; {everyone} before {clocks.pop()}, when their peers entered #{nexts.pop()} "
                    "(peers' clocks)")
        each = ", ".join(f"rank {p.rank} before {_clock_after(p.before_ns)} (peers entered "  # type: ignore[arg-type]
                         f"#{p.last_enqueued + 1} on {p.label})" for p in bounds[:6])
        return f"{text}; {each}, on the peers' clocks"


def _rank_list(ranks: list[int]) -> str:
    """``ranks 9 and 14`` / ``ranks 1,3-5``."""
    if len(ranks) == 2:
        return f"ranks {ranks[0]} and {ranks[1]}"
    return f"ranks {compress_ranks(ranks)}" if len(ranks) > 1 else f"rank {ranks[0]}"


def _clock_after(ns: int) -> str:
    """A bound "before ``ns``" in ms, rounded up so it never claims more than is known."""
    return format_clock(-(-ns // 1_000_000) * 1_000_000)


def format_clock(ns: int) -> str:
    """Epoch ns as ``10:41:03.218 UTC``."""
    t = datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    return t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d} UTC"


def order_stops(job: Job, culprits: list[Culprit], hosts: dict[int, str]) -> StopOrder:
    """Order ``culprits`` by stop time; ``hosts`` (rank -> host, where known) says which share a clock."""
    stops = {c.rank: _stopped_ns(job, c) for c in culprits}
    known = {r: t for r, t in stops.items() if t}
    by_time = tuple(sorted(known, key=lambda r: (known[r], r)))
    if not culprits:
        return StopOrder(())
    unknown = sorted(r for r in stops if not stops[r])
    if unknown:
        note = f"rank(s) {compress_ranks(unknown)} left no recorded activity to date their stop"
        points = tuple(p for p in (_stop_point(job, c) for c in culprits) if p is not None)
        if len(points) < len(culprits):
            return StopOrder(by_time, known, False, note)
        order = _program_order(job, points)
        same = order is None and len({(p.desc, p.last_enqueued) for p in points}) == 1 and not _differ(job, points)
        return StopOrder(by_time, known, False, note, points, same, order)
    if len(by_time) == 1:
        return StopOrder(by_time, known, True)
    first = by_time[0]
    for r in by_time[1:]:
        if hosts.get(r) is not None and hosts.get(r) == hosts.get(first):
            continue  # one host, one clock
        gap = (known[r] - known[first]) / 1e9
        spread = _enqueue_spread_s(job, first, r)
        where = (f" (hosts {hosts[first]}, {hosts[r]})" if hosts.get(first) and hosts.get(r) else "")
        if spread is None:
            return StopOrder(by_time, known, False,
                             f"ranks {first} and {r}{where} completed no collective in common, so their clocks "
                             f"cannot be compared; their recorded stops are {gap:.3f} s apart")
        if gap <= spread:
            return StopOrder(by_time, known, False,
                             f"ranks {first} and {r}{where} stopped {gap:.3f} s apart, but in collectives both "
                             f"completed their enqueue times differ by up to {spread:.3f} s (clock skew or "
                             "arrival), so which stopped first cannot be told")
    return StopOrder(by_time, known, True)


def _stopped_ns(job: Job, c: Culprit) -> int | None:
    """The culprit's last enqueue or completion in the groups where it is blamed (else anywhere)."""
    dump = job.dumps.get(c.rank)
    if dump is None:
        return None
    groups = {c.group_name, *(e.group for e in c.related)}
    latest = 0
    for name in groups:
        h = dump.histories.get(name)
        if h is not None and len(h.created_ns):
            latest = max(latest, max(h.created_ns))
    for e in dump.tail:
        if e.pg_name in groups and e.time_completed_ns:
            latest = max(latest, e.time_completed_ns)
    return latest or dump.latest_ns or None


def _enqueue_spread_s(job: Job, a: int, b: int) -> float | None:
    """Largest |enqueue time difference| between ranks a and b over recent collectives both
    completed, in any group they share; None when they share none."""
    da, db = job.dumps.get(a), job.dumps.get(b)
    if da is None or db is None:
        return None
    diffs: list[int] = []
    for name, ha in da.histories.items():
        hb = db.histories.get(name)
        if hb is None:
            continue
        at_a = {s: t for s, t, ok in zip(ha.seq[-_RECENT:], ha.created_ns[-_RECENT:], ha.completed[-_RECENT:]) if ok}
        diffs.extend(abs(t - at_a[s]) for s, t, ok in zip(hb.seq[-_RECENT:], hb.created_ns[-_RECENT:],
                                                           hb.completed[-_RECENT:]) if ok and s in at_a)
    return max(diffs) / 1e9 if diffs else None


def _stop_point(job: Job, c: Culprit) -> StopPoint | None:
    """The culprit's progress in its blamed group, and when its peers first went past it."""
    pg = job.groups.get(c.group_name)
    progress = job.progress(c.rank, c.group_name) if pg is not None else None
    if pg is None or progress is None:
        return None
    nxt = progress.enqueued + 1
    times = []
    for peer in pg.ranks:
        h = job.dumps[peer].histories.get(c.group_name) if peer != c.rank and peer in job.dumps else None
        if h is not None:
            times.extend(t for s, t in zip(h.seq, h.created_ns) if s == nxt and t > 0)
    return StopPoint(c.rank, c.group_name, pg.label, c.group_desc, progress.enqueued, min(times, default=None))


def _less(job: Job, a: StopPoint, b: StopPoint) -> int:
    """-1 when ``a`` got less far than ``b``, 1 when further, 0 when level or contradictory:
    compared in every group both belong to, and in their blamed groups when those are of one kind."""
    signs = set()
    if a.desc == b.desc and a.desc not in ("", "undefined"):
        signs.add((a.last_enqueued > b.last_enqueued) - (a.last_enqueued < b.last_enqueued))
    for pg in job.groups.values():
        if a.rank in pg.ranks and b.rank in pg.ranks:
            pa, pb = job.progress(a.rank, pg.name), job.progress(b.rank, pg.name)
            if pa is not None and pb is not None:
                signs.add((pa.enqueued > pb.enqueued) - (pa.enqueued < pb.enqueued))
    signs.discard(0)
    return signs.pop() if len(signs) == 1 else 0


def _differ(job: Job, points: tuple[StopPoint, ...]) -> bool:
    """Any two culprits whose progress differs anywhere they can be compared."""
    for i, a in enumerate(points):
        for b in points[i + 1:]:
            for pg in job.groups.values():
                if a.rank in pg.ranks and b.rank in pg.ranks:
                    pa, pb = job.progress(a.rank, pg.name), job.progress(b.rank, pg.name)
                    if pa is not None and pb is not None and pa.enqueued != pb.enqueued:
                        return True
    return False


def _program_order(job: Job, points: tuple[StopPoint, ...]) -> int | None:
    """The culprit that got less far than every other one (never a guess: None otherwise)."""
    if len(points) < 2:
        return None
    for a in points:
        if all(_less(job, a, b) < 0 for b in points if b is not a):
            return a.rank
    return None
