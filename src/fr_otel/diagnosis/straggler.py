"""Stragglers: no hang, but one rank consistently enqueues last.

For each collective every member recorded, each rank's lateness is its
``time_created_ns`` minus the median of the group's. Two tests, either names a
rank: over the recent collectives of all groups, it is last in at least half, by
a median beyond the threshold (a rank slow all along); or, per group, from some
collective on (the change point) it is late in at least 80% and last in at least
half of at least ``straggler_min_collectives`` collectives (a rank that turned
slow: averaging over its good past would hide it). The evidence says since which
collective and by how much. Needs no CUDA events (unlike the recorder's timing
mode). A constant clock offset between hosts looks the same: the evidence says so.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from .job import Job
from .verdict import AnalysisOptions, Evidence

__all__ = ["find_stragglers"]


_ONSET_LATE_SHARE = 0.8  # late in at least this share of the collectives since the change point


@dataclass(slots=True)
class _Onset:
    group: str
    seq: int  # first collective of the late stretch
    count: int  # collectives since then
    median_late_s: float
    median_before_s: float | None


def find_stragglers(job: Job, options: AnalysisOptions) -> list[tuple[int, Evidence]]:
    lateness: dict[int, list[float]] = {}
    last_count: Counter[int] = Counter()
    samples_in: dict[int, Counter[str]] = {}
    onsets: dict[int, _Onset] = {}
    for pg in job.ordered_groups():
        if len(pg.ranks) < 2 or any(r not in job.dumps for r in pg.ranks):
            continue
        times: dict[int, dict[int, int]] = {}
        for r in pg.ranks:
            h = job.dumps[r].histories.get(pg.name)
            if h is None:
                times = {}
                break
            window = options.straggler_window * 2
            times[r] = dict(zip(h.seq[-window:], h.created_ns[-window:]))
        common = set.intersection(*(set(t) for t in times.values())) if times else set()
        seqs = sorted(common)[-options.straggler_window :]
        series: dict[int, list[float]] = {r: [] for r in pg.ranks}
        lasts: list[int] = []
        for seq in seqs:
            stamps = {r: times[r][seq] for r in pg.ranks}
            med = statistics.median(stamps.values())
            for r, t in stamps.items():
                late = (t - med) / 1e9
                lateness.setdefault(r, []).append(late)
                series[r].append(late)
            latest_rank = max(stamps, key=stamps.__getitem__)
            lasts.append(latest_rank)
            last_count[latest_rank] += 1
            samples_in.setdefault(latest_rank, Counter())[pg.name] += 1
        for r, n_last in Counter(lasts).items():
            if n_last < options.straggler_min_collectives:
                continue
            onset = _onset(pg.name, seqs, series[r], [x == r for x in lasts], options)
            if onset is not None and (r not in onsets or onset.count > onsets[r].count):
                onsets[r] = onset
    out = []
    for rank in sorted(set(lateness) | set(onsets)):
        values = lateness.get(rank, [])
        n = len(values)
        median_late = statistics.median(values) if values else 0.0
        share_last = last_count[rank] / n if n else 0.0
        steady = n >= options.straggler_min_collectives and median_late >= options.straggler_threshold_s \
            and share_last >= 0.5
        onset = onsets.get(rank)
        if onset is not None and onset.median_before_s is not None:
            pg = job.groups[onset.group]
            before = onset.median_before_s
            text = (
                f"rank {rank} enqueued the last {onset.count} collectives on {pg.label} late, since #{onset.seq}: "
                f"a median {onset.median_late_s * 1e3:.0f} ms after its peers (before #{onset.seq}: "
                f"{before * 1e3:.0f} ms); no collective is stuck"
            )
            out.append((rank, Evidence("straggler", onset.group, onset.seq, text)))
        elif steady or onset is not None:
            group = samples_in[rank].most_common(1)[0][0] if samples_in.get(rank) else onset.group  # type: ignore[union-attr]
            pg = job.groups[group]
            p90 = sorted(values)[int(0.9 * (n - 1))] if values else 0.0
            text = (
                f"rank {rank} enqueued {last_count[rank]} of {n} recent collectives last, a median "
                f"{median_late * 1e3:.0f} ms after its peers (p90 {p90 * 1e3:.0f} ms), mostly on {pg.label}; "
                "no collective is stuck (a constant offset could also be clock skew between hosts)"
            )
            out.append((rank, Evidence("straggler", group, None, text)))
    return out


def _onset(group: str, seqs: list[int], late: list[float], last: list[bool], options: AnalysisOptions) -> _Onset | None:
    """The earliest collective from which the rank is (almost) always late and mostly last."""
    threshold = options.straggler_threshold_s
    n = len(late)
    n_late = n_last = 0
    best: int | None = None
    for s in range(n - 1, -1, -1):
        n_late += late[s] >= threshold
        n_last += last[s]
        length = n - s
        if (length >= options.straggler_min_collectives and late[s] >= threshold
                and n_late >= _ONSET_LATE_SHARE * length and 2 * n_last >= length):
            best = s
    if best is None:
        return None
    before = late[:best]
    return _Onset(group, seqs[best], n - best, statistics.median(late[best:]),
                  statistics.median(before) if before else None)
