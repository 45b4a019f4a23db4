"""Which culprit stopped first, and whether the clocks allow saying so.

A culprit stopped making progress at its last recorded activity (latest enqueue or
completion) in the groups where it is blamed. Those times come from each rank's own
clock, so two culprits on different hosts (or hosts unknown) are compared only when their
clocks are shown to agree: in the collectives both completed, their enqueue times must
differ by less than the gap between their stops (any clock offset, plus ordinary arrival
jitter, shows there). Otherwise the answer is "cannot order", never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .job import Job
from .ranks import compress_ranks
from .verdict import Culprit

__all__ = ["StopOrder", "format_clock", "order_stops"]

_RECENT = 256  # most recent shared collectives that judge two ranks' clocks


@dataclass(frozen=True, slots=True)
class StopOrder:
    """Culprits by when they stopped: ``ranks`` first-to-stop first when ``ordered``."""

    ranks: tuple[int, ...]
    stopped_ns: dict[int, int] = field(default_factory=dict)  # rank -> last activity, its own clock
    ordered: bool = False
    note: str | None = None  # why the order is not known

    @property
    def first(self) -> int | None:
        return self.ranks[0] if self.ordered and self.ranks else None

    def delay_s(self, rank: int) -> float | None:
        """Seconds after the first culprit stopped (None when not ordered)."""
        if not self.ordered or rank not in self.stopped_ns or self.first is None:
            return None
        return (self.stopped_ns[rank] - self.stopped_ns[self.first]) / 1e9

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "ordered": self.ordered, "first": self.first, "note": self.note}

    def sentence(self) -> str:
        """``rank 9 stopped first, 10:41:03.218 UTC; rank 14 0.410 s later`` (or why not)."""
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
        return StopOrder(by_time, known, False,
                         f"rank(s) {compress_ranks(unknown)} left no recorded activity to date their stop")
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
