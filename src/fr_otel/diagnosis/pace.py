"""How long things normally take in this job, and when an op in flight is stuck rather than busy.

A dump is a snapshot: pulled on demand (the debug server, ``watch``, an operator's signal)
it catches healthy ops mid-flight, pipeline sends waiting for their recv, the last stage a
microbatch behind. What separates that from a hang is age. Each op's age is measured to its
own dump's time (every rank's dump is pulled at a slightly different moment; an op waiting
on another rank is aged to the earlier of the two dumps, so skew between pulls never makes
a wait look older than both sides saw it). "Normal" is learnt from the recorder's history:
how long ranks waited for their peers to arrive, how long completed ops stayed in flight
(where the recorder timed them), and how long a rank's longest pause between two enqueues
was (its step's slow part). An op is stuck when its age is well past that
(:func:`stall_threshold_s`, the one rule the live agent's threshold is built on too).

When no dump's time is known (files copied, dated long after their last activity), ages can be
measured to the newest activity any rank recorded instead (:func:`at_work_until`), only when the job
reads as caught at work: its pace is learnt from some history, every rank left a dump, and every rank
was active within half a rank's usual longest pause of that moment (in a hang the culprit goes quiet
first; the ranks that wait keep going until they block on it). Those ages are lower bounds; the
analysis still reads the dumps as stopped first and keeps that reading when its waits converge, as a
hang's do (:mod:`.analysis`). Otherwise an undated wait counts as stuck, as before.
"""

from __future__ import annotations

import operator
import statistics
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from ..common.stall import DEFAULT_STALL_S

if TYPE_CHECKING:  # types only: the live agent imports the rule without the analysis
    from ..read.dump import GroupHistory, RankDump
    from .job import Job

__all__ = ["AT_WORK_FRACTION", "DAY_NS", "MIN_STALL_S", "STALL_FACTOR", "Ages", "Clock", "Pace", "at_work_until",
           "dumped_at_ns", "learn_pace", "stall_threshold_s"]

#: A dump file written within this long after its last recorded activity dates the dump.
DAY_NS = 86_400 * 10**9
#: "Well past normal": this many times the longest normal wait, pause or op.
STALL_FACTOR = 3.0
#: Never a stall below this, whatever the pace (a millisecond-step job still pauses for GC).
MIN_STALL_S = 1.0
#: Undated dumps read as a job caught at work when every rank was active within this fraction of a rank's usual
#: longest pause of the newest activity (simulated 3D jobs: at most 0.38 mid-step; 0.47 in one hang, 1.1-2.2 in
#: the others). A first filter only: a job at work is still judged a hang when its waits converge (analysis).
AT_WORK_FRACTION = 0.5
#: ... and when every dump holds at least this many completed collectives: a rhythm learnt, not guessed.
AT_WORK_HISTORY = 16
_WINDOW = 256  # most recent collectives per group to learn from
_SAMPLE = 48  # groups per kind learnt from (16k ranks stay cheap)
_PAUSE_SAMPLE = 16  # ranks whose longest pause is learnt (their median is the pace)


def stall_threshold_s(timeout_ms: int | None = None, normal_s: float | None = None,
                      stall_seconds: float = DEFAULT_STALL_S) -> float:
    """How old an op in flight must be to count as stuck: the one rule, live and offline.

    With the job's pace known (``normal_s``: the longest normal wait, pause or op), well past
    it: ``max(MIN_STALL_S, STALL_FACTOR * normal_s)``; without, ``stall_seconds``. Never more
    than half the op's own timeout (by then the watchdog is about to fire anyway).
    """
    base = stall_seconds if normal_s is None else max(MIN_STALL_S, STALL_FACTOR * normal_s)
    if timeout_ms and timeout_ms > 0:
        return min(base, timeout_ms / 2000)
    return base


def dumped_at_ns(dump: RankDump) -> int | None:
    """When the dump was taken, where its file (or the caller) says and the date is believable:
    at or after its last recorded activity, within a day of it. None otherwise."""
    when = dump.file_mtime_ns
    if not when or not dump.latest_ns or not 0 <= when - dump.latest_ns <= DAY_NS:
        return None
    return when


def at_work_until(dumps: dict[int, RankDump], pace: Pace) -> int | None:
    """The newest activity of undated ``dumps`` (ns), when every rank was active within
    :data:`AT_WORK_FRACTION` of a rank's usual longest pause (``pace.pause_s``) of it: the moment
    their ages are measured to. None when the pause is not learnt, a dump holds too short a history
    (:data:`AT_WORK_HISTORY`), or some rank went quiet earlier."""
    if pace.pause_s is None or len(dumps) < 2:
        return None
    if any(sum(h.completed.count(1) for h in d.histories.values()) < AT_WORK_HISTORY for d in dumps.values()):
        return None
    latest = [d.latest_ns for d in dumps.values()]
    newest = max(latest)
    if not min(latest) or newest - min(latest) > AT_WORK_FRACTION * pace.pause_s * 1e9:
        return None
    return newest


@dataclass(frozen=True, slots=True)
class Pace:
    """The job's normal tempo, learnt from the recorder's history (seconds; None: not learnt)."""

    wait_s: float | None = None  # longest a rank waited for its peers to enqueue a collective all completed
    run_s: float | None = None  # longest a completed op stayed in flight, enqueue to completion seen
    pause_s: float | None = None  # longest pause between two enqueues on a typical rank (median over ranks)

    @property
    def normal_s(self) -> float | None:
        known = [x for x in (self.wait_s, self.run_s, self.pause_s) if x is not None]
        return max(known) if known else None

    def describe(self) -> str:
        parts = []
        if self.wait_s is not None:
            parts.append(f"ranks waited up to {self.wait_s:.2f} s for their peers")
        if self.run_s is not None:
            parts.append(f"ops ran up to {self.run_s:.2f} s")
        if self.pause_s is not None:
            parts.append(f"a rank paused up to {self.pause_s:.2f} s between enqueues")
        return "; ".join(parts) if parts else "the recorder history is too short to learn the job's pace"


def learn_pace(job: Job) -> Pace:
    """Learn :class:`Pace` from every group's recent completed history (a sample on large jobs)."""
    waits: list[int] = []
    by_kind: dict[str, int] = {}
    for pg in job.ordered_groups():
        if pg.has_p2p or len(pg.ranks) < 2:
            continue
        seen = by_kind.get(pg.desc, 0)
        if seen >= _SAMPLE:
            continue
        spread = _arrival_spread(job, pg.name, pg.ranks)
        if spread is None:
            continue
        by_kind[pg.desc] = seen + 1
        waits.append(spread)
    runs = [e.time_completed_ns - e.time_created_ns for d in job.dumps.values() for e in d.tail
            if e.completed and e.time_completed_ns and e.time_completed_ns >= e.time_created_ns]
    # Only dumps with history: an only-active dump's few in-flight entries say nothing of the pace.
    pauses = [p for p in (_longest_pause(d) for d in _sample(job.dumps) if _has_history(d)) if p is not None]
    return Pace(
        wait_s=max(waits) / 1e9 if waits else None,
        run_s=max(runs) / 1e9 if runs else None,
        pause_s=statistics.median(pauses) / 1e9 if pauses else None,
    )


def _arrival_spread(job: Job, group: str, ranks: Iterable[int]) -> int | None:
    """The longest any member waited for the last to enqueue, over the group's recent collectives
    every member completed (ns); None if a member is unseen or nothing is common."""
    hs = []
    for r in ranks:
        d = job.dumps.get(r)
        h = d.histories.get(group) if d is not None else None
        if h is None or not len(h.seq):
            return None
        hs.append(h)
    if all(h.contiguous for h in hs):  # the usual case: aligned slices, max/min in C
        lo = max(h.seq[0] for h in hs)
        hi = min(_completed_upto(h) for h in hs)
        lo = max(lo, hi - _WINDOW + 1)
        if hi < lo:
            return None
        cols = [h.created_ns[lo - h.seq[0]: hi - h.seq[0] + 1] for h in hs]
        return max(map(operator.sub, map(max, *cols), map(min, *cols))) if len(cols) > 1 else None
    times = [{s: t for s, t, ok in zip(h.seq[-_WINDOW:], h.created_ns[-_WINDOW:], h.completed[-_WINDOW:]) if ok}
             for h in hs[:_SAMPLE]]  # coalesced ops share seqs: by seq, on a sample of members
    common = set.intersection(*(set(t) for t in times))
    return max((max(t[s] for t in times) - min(t[s] for t in times) for s in common), default=None)


def _completed_upto(h: GroupHistory) -> int:
    """The last seq before the member's first pending one (its last if none is pending)."""
    at = h.completed.find(0)
    return h.seq[-1] if at < 0 else h.seq[0] + at - 1


def _sample(dumps: dict[int, RankDump]) -> list[RankDump]:
    """Up to ``_PAUSE_SAMPLE`` ranks spread over the job: a median needs no more."""
    ranks = sorted(dumps)
    step = max(1, len(ranks) // _PAUSE_SAMPLE)
    return [dumps[r] for r in ranks[::step]]


def _has_history(dump: RankDump) -> bool:
    return any(h.completed.find(1) >= 0 for h in dump.histories.values())


def _longest_pause(dump: RankDump) -> int | None:
    """The longest time between two consecutive enqueues in the rank's recent history."""
    times: list[int] = []
    for h in dump.histories.values():
        times.extend(h.created_ns[-_WINDOW:])
        for ch in h.p2p.values():
            times.extend(ch.created_ns[-_WINDOW:])
    times.sort()
    start = bisect_right(times, 0)  # a time the reader could not read is 0: never a pause
    if len(times) - start < 3:
        return None
    gaps: Iterator[int] = map(operator.sub, islice(times, start + 1, None), islice(times, start, None))
    return max(gaps)


@dataclass(frozen=True, slots=True)
class Ages:
    """How old the ops in flight were when dumped, against the job's pace: the verdict's ``ages``."""

    known: bool  # some dump's time was known, so ages could be weighed (to the newest activity: see below)
    threshold_s: float  # in flight this long (or more) is a stall
    wait_s: float | None  # the pace learnt: longest normal wait for peers,
    run_s: float | None  # longest a completed op was in flight,
    pause_s: float | None  # longest pause between a rank's enqueues
    stuck: int  # waits judged stalls (or of unknown age)
    young: int  # waits judged the job at work
    oldest_young: tuple[float, int, str] | None = None  # (age s, rank, op) of the oldest wait judged normal
    oldest_stuck: tuple[float, int, str] | None = None
    #: No dump's time was known: ages are lower bounds, measured to the newest activity (see :func:`at_work_until`).
    to_newest_activity: bool = False

    def to_dict(self) -> dict[str, Any]:
        def op(x: tuple[float, int, str] | None) -> dict[str, Any] | None:
            return None if x is None else {"age_s": round(x[0], 6), "rank": x[1], "op": x[2]}
        return {"known": self.known, "threshold_s": self.threshold_s, "wait_s": self.wait_s, "run_s": self.run_s,
                "pause_s": self.pause_s, "stuck": self.stuck, "young": self.young,
                "oldest_young": op(self.oldest_young), "oldest_stuck": op(self.oldest_stuck),
                "to_newest_activity": self.to_newest_activity}


@dataclass(slots=True)
class Clock:
    """Ages of ops in flight, each to its own dump's time, judged against the job's pace."""

    dumped: dict[int, int]  # rank -> when its dump was taken (where known)
    pace: Pace
    stall_seconds: float = DEFAULT_STALL_S
    raised_over_s: float | None = None  # the live agent's stall threshold for this incident: never asks more
    running_stall_s: float | None = None  # a slow-host incident's: the live agent's stall threshold, never asks less
    young: list[tuple[float, int, str]] = field(default_factory=list)  # (age s, rank, what) judged not stuck
    old: list[tuple[float, int, str]] = field(default_factory=list)  # (age s, rank, what) judged stuck
    unknown: int = 0  # waits whose age could not be measured (counted stuck)
    at_work_ns: int | None = None  # no dump dated: the newest activity, which ages are measured to (lower bounds)

    @classmethod
    def of(cls, job: Job, *, weigh: bool = True, infer: bool = True, raised_over_s: float | None = None,
           running_stall_s: float | None = None) -> Clock:
        """``weigh``: False when the job is known to be ending (every wait then counts, whatever its age).
        ``infer``: False never measures undated dumps to their newest activity (their waits count as stuck).
        ``raised_over_s``: the threshold the live agent raised this incident over, so the verdict never
        calls young the wait the agent has just called stuck (a short history, or ranks that started
        seconds apart, can make the learnt pace ask for more). ``running_stall_s``: the live agent's stall
        threshold when it raised this incident for a slow host, the job running: the verdict never calls
        stuck a wait the agent had not."""
        dumped = {r: t for r, d in job.dumps.items() if (t := dumped_at_ns(d)) is not None} if weigh else {}
        # A stall the live agent raised the incident over (``raised_over_s``) was no snapshot; the absent may have
        # gone quiet first.
        if dumped or not weigh or not infer or raised_over_s is not None or job.missing_ranks:
            return cls(dumped, learn_pace(job) if dumped else Pace(), raised_over_s=raised_over_s,
                       running_stall_s=running_stall_s)
        pace = learn_pace(job)
        at_work = at_work_until(job.dumps, pace)
        if at_work is None:
            return cls({}, Pace(), raised_over_s=raised_over_s, running_stall_s=running_stall_s)
        return cls(dict.fromkeys(job.dumps, at_work), pace, raised_over_s=raised_over_s,
                   running_stall_s=running_stall_s, at_work_ns=at_work)

    def threshold_s(self, timeout_ms: int | None = None) -> float:
        learnt = stall_threshold_s(timeout_ms, self.pace.normal_s, self.stall_seconds)
        if self.raised_over_s is not None:
            learnt = min(learnt, self.raised_over_s)
        if self.running_stall_s is not None:
            learnt = max(learnt, stall_threshold_s(timeout_ms, None, self.running_stall_s))
        return learnt

    def earliest(self, ranks: Iterable[int]) -> int | None:
        """The earliest known dump time among ``ranks`` (None: none known)."""
        return min((self.dumped[r] for r in ranks if r in self.dumped), default=None)

    def age_s(self, created_ns: int | None, rank: int, others_at: int | None = None) -> float | None:
        """Seconds ``rank``'s op (enqueued at ``created_ns``) had been in flight when the earlier of
        its own dump and ``others_at`` (the other side's, see :meth:`earliest`) was taken; None
        when ``rank``'s dump time is unknown."""
        mine = self.dumped.get(rank)
        if mine is None or not created_ns:
            return None
        at = mine if others_at is None else min(mine, others_at)
        return max(0.0, (at - created_ns) / 1e9)

    def stuck(self, created_ns: int | None, rank: int, others_at: int | None = None, *, what: str = "",
              timeout_ms: int | None = None) -> bool:
        """Whether this op in flight is old enough to be a stall (when its age is unknown: True, unless the job
        was running when the incident was raised); remembered for the verdict's evidence."""
        age = self.age_s(created_ns, rank, others_at)
        if age is None:
            self.unknown += 1
            return self.running_stall_s is None
        stuck = self.past(age, timeout_ms)
        (self.old if stuck else self.young).append((age, rank, what))
        return stuck

    def past(self, age_s: float | None, timeout_ms: int | None = None) -> bool:
        """``age_s`` is a stall (an unknown age counts as one, unless the job was running when the incident
        was raised for a slow host, while no agent had raised a stall)."""
        if age_s is None:
            return self.running_stall_s is None
        return age_s >= self.threshold_s(timeout_ms)

    @property
    def weighed(self) -> bool:
        """Some op's age was measured (dump times known)."""
        return bool(self.young or self.old)

    def oldest_young(self) -> tuple[float, int, str] | None:
        return max(self.young, default=None)

    def summary(self) -> Ages:
        return Ages(known=bool(self.dumped) and self.at_work_ns is None, threshold_s=self.threshold_s(), wait_s=self.pace.wait_s,
                    run_s=self.pace.run_s, pause_s=self.pace.pause_s,
                    stuck=len(self.old) + (self.unknown if self.running_stall_s is None else 0),
                    young=len(self.young), oldest_young=self.oldest_young(), oldest_stuck=max(self.old, default=None),
                    to_newest_activity=self.at_work_ns is not None)
