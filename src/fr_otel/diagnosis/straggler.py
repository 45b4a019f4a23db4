"""Stragglers: no hang, but one rank enqueues late, compared with its equals.

For each collective every member of a group recorded and completed, each rank's lateness is its
``time_created_ns`` minus the median of the group's. Some ranks are late by design every
step: tensor-parallel rank 0 loads the batch before broadcasting it, the last pipeline stage
finishes its microbatches last. So a rank is compared like with like: with its *equals*, the
ranks in the same role (the same position in every kind of group that is not a data-parallel
replica dimension: same pipeline stage, same tensor-parallel rank), on the same op of the
same kind of group. Its expected lateness is what its equals show there (their median, or
the smaller of two); with no equal (one rank per role), the group's median stands in, as
before. A rank whose lateness beyond that expectation is over the threshold is a straggler:
from a change point on (over at least ``straggler_min_collectives`` collectives since, mostly
on time before), else all along (over the recent collectives, and over their recent half). Over means
the median, or, for bursty lateness, the mean with at least a quarter of the collectives late (five at
least). The change point is each rank's own: two equally slow ranks each get theirs (neither needs to be
the last to arrive). A slow host slows every rank on it, but not evenly (the scheduler serves one
first): once one of its ranks is a straggler, the others on that host are judged against half the threshold,
the rule FrOtelSlowHost holds live (one slow rank does not make its host slow: a healthy sibling is not
late at all); and a host whose ranks are late in turn (each on time every other collective) is judged by its
arrival, the later of its ranks. Series are per op, so a rank late only before its reduce_scatter is not
diluted by the all_gathers it reaches on time. Needs no CUDA events. A constant clock offset
between hosts looks the same: the evidence says so.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, replace
from typing import Any

from ..common.ranks import compress_ranks
from .job import Job, ProcessGroup
from .kinds import CulpritKind
from .verdict import AnalysisOptions, Evidence

__all__ = ["find_stragglers"]

_BURST_LATE_SHARE = 0.25  # late in at least this share (and late on average), when the median is under the threshold
# Groups of these kinds hold data-parallel replicas: a rank's position in them is not its role.
_REPLICA_KIND = re.compile(r"data|(?<![a-z])dp(?![a-z])", re.IGNORECASE)


@dataclass(slots=True)
class _Series:
    """One rank's lateness on one op of one group, oldest first."""

    rank: int
    group: ProcessGroup
    op: tuple[int, ...]  # fingerprint ids of the calls at each of these seqs
    seqs: list[int]
    late: list[float]  # seconds after the group's median enqueue

    @property
    def kind(self) -> tuple[str, int]:
        return self.group.desc, len(self.group.ranks)


@dataclass(slots=True)
class _Finding:
    series: _Series
    onset: int | None  # index of the change point; None: late all along
    late_share: float
    median_s: float  # median lateness beyond expectation, since the onset (or overall)
    mean_s: float  # the same, on average: what the others wait for it
    before_s: float | None  # before the onset
    p90_s: float
    expected_s: float
    equals: int  # how many ranks (itself included) its expectation came from

    @property
    def count(self) -> int:
        return len(self.series.seqs) - (self.onset or 0)


def find_stragglers(job: Job, options: AnalysisOptions) -> list[tuple[int, Evidence]]:
    """Ranks late beyond what their equals show, with the evidence (one per rank, the strongest)."""
    series = _lateness(job, options)
    role = _roles(job)
    typical: dict[tuple[Any, ...], list[float]] = {}  # (kind, op, role) -> each equal's median lateness
    at_seq: dict[tuple[Any, ...], dict[int, list[float]]] = {}  # ... -> seq -> each equal's lateness there
    for s in series:
        key = (s.kind, s.op, role.get(s.rank))
        typical.setdefault(key, []).append(statistics.median(s.late))
        by_seq = at_seq.setdefault(key, {})
        for seq, x in zip(s.seqs, s.late):
            by_seq.setdefault(seq, []).append(x)
    # Parallel groups of a kind run the same program (the same seq is the same op): expectations
    # are seq by seq where most equals hold the seq (by-design lateness varies within a step, and a
    # dump pulled mid-step holds the step's newest collectives completed on some equals only).
    overall = {key: _expected(peers) for key, peers in typical.items()}
    expected_at = {key: {seq: _expected(xs) for seq, xs in by_seq.items() if 2 * len(xs) > len(typical[key])}
                   for key, by_seq in at_seq.items()}
    def residual(s: _Series) -> list[float]:
        """Its lateness beyond what its equals show, collective by collective."""
        key = (s.kind, s.op, role.get(s.rank))
        at, whole = expected_at[key], overall[key]
        return [x - at.get(q, whole) for x, q in zip(s.late, s.seqs)]

    def judge_all(candidates: list[_Series], opts: AnalysisOptions) -> dict[int, _Finding]:
        best: dict[int, _Finding] = {}
        for s in candidates:
            key = (s.kind, s.op, role.get(s.rank))
            found = _judge(s, residual(s), overall[key], len(typical[key]), opts)
            if found is not None and (s.rank not in best or (found.count, found.median_s) >
                                      (best[s.rank].count, best[s.rank].median_s)):
                best[s.rank] = found
        return best
    best = judge_all(series, options)
    hosts = {r: p.place for r, p in job.processes.items() if p.place}
    slow_hosts = {hosts[r] for r in best if r in hosts}
    siblings = [s for s in series if s.rank not in best and hosts.get(s.rank) in slow_hosts]
    by_host = judge_all(siblings, replace(options, straggler_threshold_s=options.straggler_threshold_s / 2))
    out = [(r, _evidence(job, f)) for r, f in best.items()]
    for r, f in by_host.items():
        e = _evidence(job, f)
        peers = sorted(p for p in best if hosts.get(p) == hosts[r])
        out.append((r, replace(e, text=f"{e.text}; its host {hosts[r]} also holds straggler rank(s) "
                                       f"{', '.join(map(str, peers))}: a slow host slows all its ranks")))
    # A host arrives when its last rank does. A throttled host's scheduler serves its ranks in turn, so each
    # alone may be on time every other collective and stay under the threshold while the host as a whole is
    # late at every one: its arrival (the later of its ranks) is judged like a rank's.
    named = set(best) | set(by_host)
    members: dict[tuple[str, tuple[int, ...], str], list[_Series]] = {}
    for s in series:
        if s.rank in hosts:
            members.setdefault((s.group.name, s.op, hosts[s.rank]), []).append(s)
    for (_, _, host), group in members.items():
        if len(group) < 2 or len(group) == len(group[0].group.ranks) or any(m.rank in named for m in group):
            continue
        each = [residual(m) for m in group]
        arrival = [max(xs) for xs in zip(*each)]
        head = group[0]
        found = _judge(_Series(head.rank, head.group, head.op, head.seqs, arrival), arrival, 0.0, 1, options)
        # Held long enough that hiccups of different ranks do not add up to one (twice the minimum), and every
        # rank of the host late on average by a quarter of the threshold: the host, not one rank's bad moments.
        since = found.onset or 0 if found is not None else 0
        if (found is not None and found.count >= 2 * options.straggler_min_collectives
                and all(statistics.fmean(r[since:]) >= options.straggler_threshold_s / 4 for r in each)):
            ranks = sorted(m.rank for m in group)
            named.update(ranks)
            out.extend((r, _host_evidence(job, found, host, ranks)) for r in ranks)
    return sorted(out, key=lambda item: item[0])


def _host_evidence(job: Job, f: _Finding, host: str, ranks: list[int]) -> Evidence:
    """The evidence of a host whose ranks are late together (its arrival, the later of them, judged)."""
    s = f.series
    who = f"the ranks of host {host} ({compress_ranks(ranks)})"
    n_late = round(f.late_share * f.count)
    since = (f", since #{s.seqs[f.onset]}" if f.onset is not None else "")
    before = (f"; before: {f.before_s * 1e3:.0f} ms" if f.before_s is not None else "")
    text = (f"{who} enqueued {n_late} of the last {f.count} {_op_text(job, s)} on {s.group.label} late together"
            f"{since}: the later of them a median {f.median_s * 1e3:.0f} ms after their peers (mean "
            f"{f.mean_s * 1e3:.0f} ms{before}), though each alone is on time some of the time (the host's CPU "
            "serves one first): a slow host slows all its ranks; no collective is stuck")
    return Evidence(CulpritKind.STRAGGLER, s.group.name, s.seqs[f.onset] if f.onset is not None else None, text)


def _lateness(job: Job, options: AnalysisOptions) -> list[_Series]:
    """Per group with every member's dump, per op, per member: lateness over the recent common seqs."""
    out: list[_Series] = []
    window = options.straggler_window
    for pg in job.ordered_groups():
        if len(pg.ranks) < 2 or pg.has_p2p or any(r not in job.dumps for r in pg.ranks):
            continue
        times: dict[int, dict[int, int]] = {}
        ops: dict[int, tuple[int, ...]] = {}
        for r in pg.ranks:
            h = job.dumps[r].histories.get(pg.name)
            if h is None:
                times = {}
                break
            seqs, created, done = h.seq[-2 * window:], h.created_ns[-2 * window:], h.completed[-2 * window:]
            # Completed collectives only: one still in flight is a snapshot of arrivals still under
            # way (and all an only-active dump holds), not a record of who came late.
            times[r] = {s: t for s, t, ok in zip(seqs, created, done) if ok}
            if not ops:
                for seq, fid in zip(seqs, h.fingerprint[-2 * window:]):
                    ops[seq] = ops.get(seq, ()) + (fid,)
        if not times:
            continue
        common = sorted(set.intersection(*(set(t) for t in times.values())) & set(ops))[-window:]
        by_op: dict[tuple[int, ...], list[int]] = {}
        for seq in common:
            by_op.setdefault(ops[seq], []).append(seq)
        for op, op_seqs in by_op.items():
            if len(op_seqs) < options.straggler_min_collectives:
                continue
            medians = [statistics.median(times[r][s] for r in pg.ranks) for s in op_seqs]
            for r in pg.ranks:
                out.append(_Series(r, pg, op, op_seqs, [(times[r][s] - m) / 1e9 for s, m in zip(op_seqs, medians)]))
    return out


def _roles(job: Job) -> dict[int, tuple[Any, ...]]:
    """Each rank's role: its position in every kind of group (desc, size) with several instances
    that is not a data-parallel replica dimension; ranks with the same role are equals."""
    kinds: dict[tuple[str, int], list[ProcessGroup]] = {}
    for pg in job.groups.values():
        kinds.setdefault((pg.desc, len(pg.ranks)), []).append(pg)
    use = sorted(k for k, groups in kinds.items() if len(groups) > 1 and not _REPLICA_KIND.search(k[0]))
    roles: dict[int, list[int]] = {r: [-1] * len(use) for r in job.dumps}
    for i, k in enumerate(use):
        for pg in kinds[k]:
            for pos, r in enumerate(pg.ranks):
                if r in roles:
                    roles[r][i] = pos
    return {r: tuple(v) for r, v in roles.items()}


def _expected(peers: list[float]) -> float:
    """How late a rank's equals are (itself among them): their median, the smaller of two, or 0 alone."""
    if len(peers) >= 3:
        return statistics.median(peers)
    if len(peers) == 2:
        return min(peers)
    return 0.0


def _judge(s: _Series, res: list[float], expected: float, equals: int, options: AnalysisOptions) -> _Finding | None:
    """Late from a change point on (on time before), else late all along; None when neither holds."""
    threshold = options.straggler_threshold_s
    n = len(res)
    late = [x >= threshold for x in res]

    def held_up(lo: int, hi: int) -> bool:
        return _held_up(res[lo:hi], late[lo:hi], threshold, options.straggler_min_collectives)
    # The change point: the split that best separates "mostly on time" before from "late" after.
    score = best_score = sum(1 if x else -1 for x in late)  # everything "after" a split at 0
    best = 0
    for i in range(1, n):
        score += -2 if late[i - 1] else 2  # move seq i-1 to "before"
        if score > best_score:
            best, best_score = i, score
    after, before = res[best:], res[:best]
    if best and len(after) >= options.straggler_min_collectives and late[best] and held_up(best, n) \
            and not held_up(0, best):
        return _Finding(s, best, sum(late[best:]) / len(after), statistics.median(after), statistics.fmean(after),
                        statistics.median(before), _p90(after), expected, equals)
    # No onset (or the part before it was late too): the whole window, and its recent half alike (a rank
    # slow once and on time since is no straggler now).
    if n < options.straggler_min_collectives or not held_up(0, n) or not held_up(n // 2, n):
        return None
    return _Finding(s, None, sum(late) / n, statistics.median(res), statistics.fmean(res), None, _p90(res),
                    expected, equals)


def _held_up(res: list[float], late: list[bool], threshold: float, min_late: int) -> bool:
    """Late typically (the median), or, bursty, late often (a quarter of the collectives, ``min_late`` at least)
    and by the threshold on average: a host whose CPU quota runs out now and then makes its ranks 40, 90,
    140 ms late in turn, some under the threshold, and what the others wait for is the mean."""
    if not res:
        return False
    n_late = sum(late)
    return (statistics.median(res) >= threshold
            or (n_late >= max(min_late, _BURST_LATE_SHARE * len(res)) and statistics.fmean(res) >= threshold))


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def _evidence(job: Job, f: _Finding) -> Evidence:
    s = f.series
    label = s.group.label
    what = _op_text(job, s)
    like = (f" (compared with its {f.equals - 1} equal(s) in the same role, which are {f.expected_s * 1e3:.0f} ms "
            "late there by design)" if f.equals > 1 and abs(f.expected_s) >= 0.001 else "")
    if f.onset is not None and f.before_s is not None:  # a change point always has a before
        seq = s.seqs[f.onset]
        n_late = round(f.late_share * f.count)
        most = "the last" if n_late == f.count else f"{n_late} of the last"
        text = (f"rank {s.rank} enqueued {most} {f.count} {what} on {label} late, since #{seq}: a median "
                f"{f.median_s * 1e3:.0f} ms after its peers (mean {f.mean_s * 1e3:.0f} ms; before #{seq}: "
                f"{f.before_s * 1e3:.0f} ms){like}; no collective is stuck")
        return Evidence(CulpritKind.STRAGGLER, s.group.name, seq, text)
    n_late = round(f.late_share * len(s.seqs))
    text = (f"rank {s.rank} enqueued {n_late} of {len(s.seqs)} recent {what} on {label} late, a median "
            f"{f.median_s * 1e3:.0f} ms after its peers (mean {f.mean_s * 1e3:.0f} ms, p90 {f.p90_s * 1e3:.0f} ms)"
            f"{like}; no collective is stuck (a constant offset could also be clock skew between hosts)")
    return Evidence(CulpritKind.STRAGGLER, s.group.name, None, text)


def _op_text(job: Job, s: _Series) -> str:
    """``_reduce_scatter_base`` (the first call of the op), from the rank's own fingerprint table."""
    dump = job.dumps[s.rank]
    for fid in s.op:
        call = dump.fingerprints.get(fid)
        if call and call[0] != "coalesced":
            return f"{call[0]} collectives"
    return "collectives"

