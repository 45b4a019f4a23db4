"""Stragglers: no hang, but one rank consistently enqueues last.

For each collective every member recorded, each rank's lateness is its
``time_created_ns`` minus the median of the group's. A rank that is last in at
least half of the recent collectives, by a median beyond the threshold, is a
straggler. Needs no CUDA events (unlike the recorder's timing mode). A constant
clock offset between hosts looks the same: the evidence says so.
"""

from __future__ import annotations

import statistics
from collections import Counter

from .job import Job
from .verdict import AnalysisOptions, Evidence

__all__ = ["find_stragglers"]


def find_stragglers(job: Job, options: AnalysisOptions) -> list[tuple[int, Evidence]]:
    lateness: dict[int, list[float]] = {}
    last_count: Counter[int] = Counter()
    samples_in: dict[int, Counter[str]] = {}
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
        for seq in sorted(common)[-options.straggler_window :]:
            stamps = {r: times[r][seq] for r in pg.ranks}
            med = statistics.median(stamps.values())
            for r, t in stamps.items():
                lateness.setdefault(r, []).append((t - med) / 1e9)
            latest_rank = max(stamps, key=stamps.__getitem__)
            last_count[latest_rank] += 1
            samples_in.setdefault(latest_rank, Counter())[pg.name] += 1
    out = []
    for rank, values in sorted(lateness.items()):
        n = len(values)
        if n < options.straggler_min_collectives:
            continue
        median_late = statistics.median(values)
        share_last = last_count[rank] / n
        if median_late >= options.straggler_threshold_s and share_last >= 0.5:
            group = samples_in[rank].most_common(1)[0][0]
            pg = job.groups[group]
            p90 = sorted(values)[int(0.9 * (n - 1))]
            text = (
                f"rank {rank} enqueued {last_count[rank]} of {n} recent collectives last, a median "
                f"{median_late * 1e3:.0f} ms after its peers (p90 {p90 * 1e3:.0f} ms), mostly on {pg.label}; "
                "no collective is stuck (a constant offset could also be clock skew between hosts)"
            )
            out.append((rank, Evidence("straggler", group, None, text)))
    return out
