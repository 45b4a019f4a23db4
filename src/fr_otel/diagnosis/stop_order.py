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

from ..common.ranks import compress_ranks
from .job import Job
from .verdict import Culprit, StopOrder, StopPoint

__all__ = ["order_stops"]

_RECENT = 256  # most recent shared collectives that judge two ranks' clocks


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
    times: list[int] = []
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
