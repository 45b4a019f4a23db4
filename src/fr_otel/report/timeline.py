"""The timeline of the HTML report: one SVG lane per rank, big jobs folded into summary lanes.

Pure functions of the job and its verdict. Bars run from enqueue to completion; gloo
records no completion time, so a completed gloo op ends at the rank's next enqueue
(marked as estimated); an op still in flight runs to the reference time (the dump) and
is drawn open-ended. The collective the job is stuck in is outlined on every lane, ranks
that never enqueued it get a dashed "ghost" where it would be, and the minority of a
mismatch is filled in its own colour. With hundreds of ranks the culprits and a sample of
the ranks waiting on them keep their own lanes; the others are folded, by what they are
doing, into summary lanes that show the median rank (with counts).

Everything that comes from a dump goes through :func:`esc` before it reaches the markup.
"""

from __future__ import annotations

import html
import math
import re
import statistics
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ..common.ranks import compress_ranks
from ..diagnosis.analysis import Culprit, Verdict
from ..diagnosis.job import Job, ProcessGroup
from ..read.dump import Entry, RankDump

__all__ = ["Facts", "clip", "esc", "fmt_duration", "fmt_rel", "history_at", "render_timeline", "tail_entry"]

# Lanes and drawing constants (SVG user units; the SVG scales to the page width).
ALL_LANES_UP_TO = 32  # jobs this small get one lane per rank
MAX_EXPANDED = 24  # otherwise: culprits + a sample of waiting ranks, at most this many lanes
MAX_CULPRIT_LANES = 16
MAX_SUMMARY_LANES = 6
HISTORY_PER_LANE = 16  # recent entries per expanded lane that set the time window
MAX_BARS_PER_LANE = 240
WIDTH = 1200
LABEL_W = 214
PLOT_X0 = LABEL_W + 8
PLOT_X1 = WIDTH - 18
AXIS_H = 34
ROW_H = 15
BAR_H = 11
LANE_PAD = 5
ROW_BUDGET = 1000  # px of lanes before rows per lane are capped harder
GROUP_COLOURS = ("#4c78a8", "#72b7b2", "#54a24b", "#9d7fc9", "#b07aa1", "#79706e", "#88a8c8", "#8cb369")
NEUTRAL_COLOUR = "#6b7f99"

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def clip(text: str, limit: int = 160) -> str:
    """At most ``limit`` characters (an ellipsis says when cut): dumps may hold huge strings."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def esc(value: object, limit: int | None = None) -> str:
    """HTML-escape untrusted text (quotes included); control characters and lone
    surrogates (undecodable file names) become U+FFFD so the output is valid UTF-8."""
    text = value if isinstance(value, str) else str(value)
    if limit is not None:
        text = clip(text, limit)
    return html.escape(_CONTROL.sub("\ufffd", text), quote=True)


def fmt_duration(ns: float) -> str:
    """A positive duration for people: ``850 µs``, ``12 ms``, ``30.4 s``, ``4 min 10 s``, ``2 h 5 min``."""
    s = max(ns, 0) / 1e9
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 0.01:
        return f"{s * 1e3:.1f} ms"
    if s < 1:
        return f"{s * 1e3:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    if s < 86400 * 2:
        return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    return f"{s / 86400:.1f} days"


def fmt_rel(ns: float) -> str:
    """A time relative to the reference: ``−30.4 s`` (before it), ``0``, ``+2 ms``."""
    if ns == 0:
        return "0"
    return ("−" if ns < 0 else "+") + fmt_duration(abs(ns))


def tail_entry(dump: RankDump | None, group: str, seq: int) -> Entry | None:
    """The collective entry of ``group`` at ``seq`` if the dump's tail (newest and in-flight
    entries, always at hand) holds it; never loads the full dump."""
    if dump is None:
        return None
    for e in reversed(dump.tail):
        if e.pg_name == group and e.collective_seq_id == seq and not e.is_p2p:
            return e
    return None


def history_at(dump: RankDump | None, group: str, seq: int) -> tuple[str, int, bool] | None:
    """(op, enqueue time, completed) of ``group`` #``seq`` from the dump's columns (every
    collective the ring kept), or None."""
    if dump is None:
        return None
    h = dump.histories.get(group)
    if h is None:
        return None
    i = bisect_left(h.seq, seq)
    if i >= len(h.seq) or h.seq[i] != seq:
        return None
    fp = dump.fingerprints.get(h.fingerprint[i])
    op = str(fp[0]) if fp else "collective"
    return op, h.created_ns[i], bool(h.completed[i])


# --------------------------------------------------------------------------- facts shared with the report


@dataclass(slots=True)
class Pending:
    """The oldest collective of a group that ``rank`` enqueued and has not completed."""

    group: ProcessGroup
    seq: int
    op: str
    created_ns: int | None
    entry: Entry | None


class Op(NamedTuple):
    """One op of a rank drawn on the timeline (from the columns, completed by the tail)."""

    group: str
    seq: int
    op: str  # without the backend prefix
    name: str  # profiling name, e.g. nccl:all_reduce
    created: int
    end: int
    est: bool  # end estimated (no completion time recorded)
    open: bool  # in flight: never completed
    clipped: bool  # starts before the window
    p2p: bool
    entry: Entry | None


@dataclass(slots=True)
class Facts:
    """What the report needs to know about every rank, computed once, from the verdict,
    the dumps' columns and their tails (the full entry lists are never loaded here)."""

    job: Job
    verdict: Verdict
    ref: int | None
    pending: dict[int, list[Pending]]
    culprits: dict[int, Culprit]
    stuck: dict[tuple[str, int], Stuck]  # (group name, seq) -> the collectives the job is stuck in, main first
    mismatch_at: dict[tuple[str, int], set[int]]  # (group, seq) -> minority ranks
    waiting: tuple[int, ...]  # ranks waiting on a culprit
    ranks: tuple[int, ...]  # every rank of the job (dumped or missing)

    @classmethod
    def of(cls, job: Job, verdict: Verdict) -> Facts:
        pending: dict[int, list[Pending]] = {}
        for gs in verdict.groups:
            for r, p in gs.progress.items():
                if p is not None and p.completed < p.enqueued:
                    seq = p.completed + 1
                    d = job.dumps.get(r)
                    e = tail_entry(d, gs.group.name, seq)
                    if e is not None:
                        item = Pending(gs.group, seq, e.op, e.time_created_ns, e)
                    else:
                        h = history_at(d, gs.group.name, seq)
                        item = Pending(gs.group, seq, h[0] if h else "collective", h[1] if h else None, None)
                    pending.setdefault(r, []).append(item)
        for items in pending.values():
            items.sort(key=lambda x: (x.created_ns is None, x.created_ns or 0, x.group.name))
        culprits = {c.rank: c for c in verdict.culprits}
        mismatch_at: dict[tuple[str, int], set[int]] = {}
        for c in verdict.culprits:
            if c.kind == "mismatch" and c.collective_seq_id is not None:
                mismatch_at.setdefault((c.group_name, c.collective_seq_id), set()).add(c.rank)
            for ev in c.related:
                if ev.kind == "mismatch" and ev.seq is not None:
                    mismatch_at.setdefault((ev.group, ev.seq), set()).add(c.rank)
        stuck = _stuck(job, verdict)
        waiting = tuple(sorted({w for c in verdict.culprits for w in c.waiting_ranks} - set(culprits)))
        everyone = set(job.dumps) | set(job.missing_ranks)
        for g in job.groups.values():
            everyone.update(g.ranks)
        ref = verdict.reference_ns or max((d.latest_ns for d in job.dumps.values()), default=0) or None
        return cls(job, verdict, ref, pending, culprits, stuck, mismatch_at, waiting, tuple(sorted(everyone)))

    @property
    def focus(self) -> tuple[str, int] | None:
        """The main collective the job is stuck in (the first culprit's)."""
        return next(iter(self.stuck), None)

    def group_label(self, name: str) -> str:
        pg = self.job.groups.get(name)
        return pg.label if pg else name

    def doing(self, rank: int) -> tuple[str, str]:
        """(fold key, text): what ``rank`` is doing, in words without per-rank numbers in the key."""
        d = self.job.dumps.get(rank)
        if d is None:
            return "no dump", "no dump from this rank"
        items = self.pending.get(rank, [])
        if items:
            first = items[0]
            text = f"in flight: {first.op} #{first.seq} on {first.group.label}"
            more = f" (+{len(items) - 1} more group{'s' if len(items) > 2 else ''})" if len(items) > 1 else ""
            return text, text + more
        if not d.tail:
            return "idle (nothing recorded)", "idle: its dump holds no collectives"
        last = d.tail[-1]
        key = f"idle: last enqueued {last.op} #{last.collective_seq_id} on {self.group_label(last.pg_name)}"
        return key, key


@dataclass(slots=True)
class Stuck:
    """A collective the job is stuck in: who entered it, who never did, since when."""

    op: str | None
    entered: tuple[int, ...]
    not_entered: tuple[int, ...]
    since: int | None  # earliest enqueue among the ranks that entered it


MAX_STUCK = 16


def _stuck(job: Job, verdict: Verdict) -> dict[tuple[str, int], Stuck]:
    """Each culprit's collective (the first culprit's first), else the oldest blocked one."""
    by_name = {g.group.name: g for g in verdict.groups}
    out: dict[tuple[str, int], Stuck] = {}
    for c in verdict.culprits:
        if c.collective_seq_id is None or c.kind == "straggler":
            continue
        key = (c.group_name, c.collective_seq_id)
        if key in out:
            continue
        gs = by_name.get(c.group_name)
        fl = gs.in_flight if gs else None
        op = (c.op or "").partition(":")[2] or c.op
        if fl is not None and fl.seq == c.collective_seq_id:
            out[key] = Stuck(fl.op or op, fl.entered, fl.not_entered, fl.since_ns)
        else:
            out[key] = Stuck(op, (), (), None)
        if len(out) >= MAX_STUCK:
            break
    if out:
        return out
    blocked = [g for g in verdict.groups if g.in_flight is not None and g.note is None]
    if not blocked:
        return out
    blocked.sort(key=lambda g: (not g.in_flight.not_entered, g.in_flight.since_ns or 0))  # type: ignore[union-attr]
    fl = blocked[0].in_flight
    assert fl is not None
    return {(blocked[0].group.name, fl.seq): Stuck(fl.op, fl.entered, fl.not_entered, fl.since_ns)}


# --------------------------------------------------------------------------- lanes


@dataclass(slots=True)
class Bar:
    start: int
    end: int
    kind: str  # done | est | open | ghost
    group: str
    seq: int
    label: str
    title: str
    focus: bool = False
    mismatch: str = ""  # "" | "odd" (this rank's op is the minority) | "peer"
    clipped: bool = False
    count: int = 0  # summary lanes: ranks behind this bar
    row: int = 0


@dataclass(slots=True)
class Lane:
    label: str
    sub: str
    title: str
    culprit: bool = False
    summary: bool = False
    missing: bool = False
    bars: list[Bar] = field(default_factory=list)
    rows: int = 1
    note: str = ""  # after the label, dimmed


def _choose_lanes(f: Facts) -> tuple[list[int], list[tuple[str, list[int]]]]:
    """Ranks with their own lane, and (what they do, ranks) folded into summary lanes."""
    ranks = f.ranks
    if len(ranks) <= ALL_LANES_UP_TO:
        return list(ranks), []
    chosen: list[int] = sorted(f.culprits)[:MAX_CULPRIT_LANES]
    picked = set(chosen)

    def add(candidates: Sequence[int], n: int) -> None:
        cands = [r for r in candidates if r not in picked]
        if not cands:
            return
        m = len(cands)
        idx = list(dict.fromkeys((0, m - 1, m // 2, m // 4, 3 * m // 4)))[:n]
        for i in sorted(idx):
            if len(picked) >= MAX_EXPANDED:
                return
            picked.add(cands[i])
            chosen.append(cands[i])

    for c in f.verdict.culprits[:MAX_CULPRIT_LANES]:
        add(c.waiting_ranks, 3)
    for info in list(f.stuck.values())[:4]:
        add(info.entered, 3)
        add(info.not_entered, 2)
    if len(picked) < 4:
        add(ranks, 4)
    chosen.sort()
    classes: dict[str, list[int]] = {}
    for r in ranks:
        if r not in picked:
            classes.setdefault(f.doing(r)[0], []).append(r)
    folded = sorted(classes.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    if len(folded) > MAX_SUMMARY_LANES:
        rest = [r for _, rs in folded[MAX_SUMMARY_LANES - 1:] for r in rs]
        folded = folded[: MAX_SUMMARY_LANES - 1] + [("other states (see the group table)", sorted(rest))]
    return chosen, folded


def _window_start(f: Facts, lanes: Iterable[int]) -> int | None:
    """Early enough that every lane shows its last ``HISTORY_PER_LANE`` collectives."""
    starts = []
    for r in lanes:
        d = f.job.dumps.get(r)
        if d is None:
            continue
        newest: list[int] = []
        for h in d.histories.values():
            newest.extend(h.created_ns[-HISTORY_PER_LANE:])
        newest.extend(e.time_created_ns for e in d.tail[-HISTORY_PER_LANE:] if e.is_p2p)
        newest = [t for t in newest if t > 0]
        if newest:
            newest.sort()
            starts.append(newest[-min(HISTORY_PER_LANE, len(newest))])
    if f.focus is not None:
        for r in f.stuck[f.focus].entered[:64]:
            h = history_at(f.job.dumps.get(r), *f.focus)
            if h is not None and h[1] > 0:
                starts.append(h[1])
    return min(starts) if starts else None


def _ops(f: Facts, rank: int, start: int, ref: int) -> list[Op]:
    """``rank``'s ops overlapping [start, ref], oldest first: collectives from the columns
    (complete for the ring), completion times and p2p ops from the tail."""
    d = f.job.dumps.get(rank)
    if d is None:
        return []
    tail = {(e.pg_name, e.collective_seq_id): e for e in d.tail if not e.is_p2p}
    prefix = d.backend + ":" if d.backend not in ("", "unknown") else ""
    rows: list[tuple[int, str, int, bool, int, Entry | None]] = []  # created, group, seq, done, fp, entry
    for name, h in d.histories.items():
        created = h.created_ns
        n = len(created)
        lo = max(0, bisect_left(created, start) - 1, n - MAX_BARS_PER_LANE)
        for j in range(lo, n):
            seq = h.seq[j]
            rows.append((created[j], name, seq, bool(h.completed[j]), h.fingerprint[j], tail.get((name, seq))))
        pos = h.completed.find(0, 0, lo)  # ops older than the window, still in flight
        found = 0
        while pos != -1 and found < 64:
            rows.append((created[pos], name, h.seq[pos], False, h.fingerprint[pos], tail.get((name, h.seq[pos]))))
            found += 1
            pos = h.completed.find(0, pos + 1, lo)
    for e in d.tail:
        if e.is_p2p:
            rows.append((e.time_created_ns, e.pg_name, e.p2p_seq_id, e.completed, 0, e))
    rows.sort(key=lambda x: x[0])
    out: list[Op] = []
    for i, (created, name, seq, done, fp, e) in enumerate(rows):
        nxt = rows[i + 1][0] if i + 1 < len(rows) else None
        if e is not None and e.record_id in d.next_created_ns:
            nxt = d.next_created_ns[e.record_id]
        if not done:
            end, est, open_ = max(ref, created), False, True
        elif e is not None and e.time_completed_ns and e.time_completed_ns >= created:
            end, est, open_ = e.time_completed_ns, False, False
        elif e is not None and e.duration_ms is not None:
            end, est, open_ = created + int(e.duration_ms * 1e6), True, False
        elif nxt is not None:
            end, est, open_ = max(nxt, created), True, False
        else:
            end, est, open_ = created, True, False  # done, when unknown: sized below
        if created < start and end <= start:
            continue
        if e is not None:
            op, pname, p2p = e.op, e.profiling_name, e.is_p2p
        else:
            fpt = d.fingerprints.get(fp)
            op = str(fpt[0]) if fpt else "collective"
            pname, p2p = prefix + op, False
        out.append(Op(name, seq, op, pname, created, end, est, open_, created < start, p2p, e))
    # The newest op done without a completion time and no later enqueue: give it the
    # lane's typical length rather than none (it is marked estimated anyway).
    if out and out[-1].est and out[-1].end == out[-1].created:
        lengths = [o.end - o.created for o in out[:-1] if o.est and not o.open]
        if lengths:
            out[-1] = out[-1]._replace(end=out[-1].created + int(statistics.median(lengths)))
    return out


def _op_title(f: Facts, rank: int | None, o: Op, ref: int) -> str:
    who = f"rank {rank}: " if rank is not None else ""
    num = f"#{o.seq}" if not o.p2p else f"p2p #{o.seq}"
    lines = [f"{who}{o.name} {num} on {f.group_label(o.group)}", f"enqueued {fmt_rel(o.created - ref)}"]
    if o.open:
        lines.append(f"in flight, never completed ({fmt_duration(ref - o.created)} at the reference time)")
    elif o.est:
        lines.append(f"done; end estimated at {fmt_rel(o.end - ref)} (no completion time recorded: next enqueue)")
    else:
        lines.append(f"completed {fmt_rel(o.end - ref)} (took {fmt_duration(o.end - o.created)})")
    e = o.entry
    if e is not None and e.input_sizes:
        sizes = ",".join("[" + ",".join(map(str, s)) + "]" for s in e.input_sizes[:4])
        lines.append(f"in {clip(sizes, 80)} {'/'.join(e.input_dtypes[:4])}")
    return "\n".join(lines)


def _lane_for_rank(f: Facts, rank: int, start: int, ref: int) -> Lane:
    c = f.culprits.get(rank)
    _, text = f.doing(rank)
    if c is not None:
        sub = f"culprit · {c.kind.replace('_', ' ')}"
    elif rank in f.waiting:
        sub = "waiting · " + text.removeprefix("in flight: ")
    else:
        sub = text
    lane = Lane(label=f"rank {rank}", sub=sub, title=f"rank {rank}: {text}", culprit=c is not None)
    if rank not in f.job.dumps:
        lane.missing = True
        lane.sub = "no dump" if c is None else lane.sub + " · no dump"
        return lane
    for o in _ops(f, rank, start, ref):
        odd = None if o.p2p else f.mismatch_at.get((o.group, o.seq))
        bar = Bar(
            start=o.created, end=o.end, kind="open" if o.open else "est" if o.est else "done",
            group=o.group, seq=o.seq if not o.p2p else -1, label=f"{o.op} #{o.seq}",
            title=_op_title(f, rank, o, ref),
            focus=not o.p2p and (o.group, o.seq) in f.stuck,
            mismatch=("odd" if rank in odd else "peer") if odd else "", clipped=o.clipped,
        )
        if bar.mismatch == "odd":
            bar.title += "\nmismatch: this rank's call differs from its peers' at this sequence number"
        lane.bars.append(bar)
    for (g, seq), info in f.stuck.items():
        if rank not in info.not_entered:
            continue
        ghost_start = info.since if info.since is not None else max(
            (b.end for b in lane.bars if b.kind != "open"), default=start)
        lane.bars.append(Bar(
            start=ghost_start, end=ref, kind="ghost", group=g, seq=seq,
            label=f"never enqueued {info.op or 'collective'} #{seq}",
            title=f"rank {rank} never enqueued {info.op or 'collective'} #{seq} on {f.group_label(g)}; "
                  "its peers wait in it",
            focus=True,
        ))
    return lane


def _summary_lane(f: Facts, what: str, ranks: list[int], start: int, ref: int) -> Lane:
    """Ranks folded into one lane: the history of a typical one of them (the median by last
    activity), and each op still in flight on them aggregated (median enqueue, counts)."""
    n = len(ranks)
    dumped = [r for r in ranks if r in f.job.dumps]
    lane = Lane(label=f"{n} rank{'s' if n != 1 else ''}", sub=what.removeprefix("in flight: "), summary=True,
                title=f"ranks {compress_ranks(ranks, limit=40)}: {what}")
    if not dumped:
        lane.missing = True
        return lane
    dumped.sort(key=lambda r: (f.job.dumps[r].latest_ns, r))
    typical = dumped[len(dumped) // 2]
    lane.note = f"e.g. rank {typical}"
    lane.title += f"\nbars: the history of rank {typical} (typical of them); in-flight ops: all of them"
    for o in _ops(f, typical, start, ref):
        if o.open:
            continue
        lane.bars.append(Bar(
            start=o.created, end=o.end, kind="est" if o.est else "done", group=o.group,
            seq=o.seq if not o.p2p else -1, label=f"{o.op} #{o.seq}",
            title=f"typical of these {n} ranks — " + _op_title(f, typical, o, ref), count=1,
            focus=not o.p2p and (o.group, o.seq) in f.stuck,
        ))
    # Groups of one kind (the 128 "tp" groups of a 1024-rank job) fold together by desc.
    family = _families(f.job)
    agg: dict[tuple[str, int], list[Op]] = {}
    for r in dumped:
        for o in _ops(f, r, start, ref):
            if o.open and not o.p2p:
                agg.setdefault((family.get(o.group, o.group), o.seq), []).append(o)
    for key in sorted(agg, key=lambda k: -len(agg[k]))[:MAX_BARS_PER_LANE]:
        items = agg[key]
        seq = key[1]
        starts = sorted(o.created for o in items)
        o0 = items[0]
        names = {o.group for o in items}
        pg = f.job.groups.get(o0.group)
        where = (f.group_label(o0.group) if len(names) == 1 else
                 f"{len(names)} groups “{clip(pg.desc if pg else key[0], 60)}”")
        s_med = starts[len(starts) // 2]
        title = (f"{len(items)} of {n} ranks in flight: {o0.name} #{seq} on {where}, never completed\n"
                 f"enqueued {fmt_rel(starts[0] - ref)} … {fmt_rel(starts[-1] - ref)} (median {fmt_rel(s_med - ref)})")
        odd = any(f.mismatch_at.get((g, seq)) for g in names)
        lane.bars.append(Bar(
            start=s_med, end=ref, kind="open", group=o0.group, seq=seq, label=f"{o0.op} #{seq} ×{len(items)}",
            title=title, focus=any((g, seq) in f.stuck for g in names), mismatch="peer" if odd else "",
            clipped=s_med < start, count=len(items),
        ))
    for (g, seq), info in f.stuck.items():
        not_entered = set(info.not_entered)
        missing = [r for r in ranks if r in not_entered]
        if missing:
            lane.bars.append(Bar(
                start=info.since or start, end=ref, kind="ghost", group=g, seq=seq,
                label=f"{len(missing)} never enqueued {info.op or 'collective'} #{seq}",
                title=f"ranks {compress_ranks(missing)} never enqueued {info.op or 'collective'} #{seq} on "
                      f"{f.group_label(g)}", focus=True, count=len(missing),
            ))
    lane.bars.sort(key=lambda b: b.start)
    return lane


def _families(job: Job) -> dict[str, str]:
    """Group name -> a key shared by every group with the same desc, when several have it."""
    by_desc: dict[str, list[str]] = {}
    for g in job.groups.values():
        if g.desc and g.desc != "undefined":
            by_desc.setdefault(g.desc, []).append(g.name)
    return {n: "desc:" + d for d, names in by_desc.items() if len(names) > 1 for n in names}


# --------------------------------------------------------------------------- scale and axis


class _Scale:
    """Time to x. When the dump comes long after the last activity, the idle stretch is cut
    out of the axis (a break) so the recent history keeps its width."""

    def __init__(self, lo: int, hi: int, ref: int, ref_label: str = "0") -> None:
        hi = max(hi, lo + 1)
        span = hi - lo
        self.ref = ref
        self.ref_label = ref_label
        self.broken = ref > hi and (ref - hi) > 0.6 * span
        w = PLOT_X1 - PLOT_X0
        if self.broken:
            self.a0 = lo - int(0.02 * span)
            self.a1 = hi + int(0.04 * span)
            self.xa1 = PLOT_X0 + 0.83 * w
            self.xb0 = PLOT_X0 + 0.89 * w
            per_ns = (self.xa1 - PLOT_X0) / (self.a1 - self.a0)
            self.b0 = ref - int((PLOT_X1 - self.xb0) / per_ns)
            if self.b0 <= self.a1:  # the tail would overlap: no break after all
                self.broken = False
        if not self.broken:
            top = max(ref, hi)
            self.a0 = lo - int(0.02 * (top - lo))
            self.a1 = top
            self.xa1 = PLOT_X1

    def x(self, t: int) -> float:
        return min(max(self._x(t), PLOT_X0), PLOT_X1)

    def _x(self, t: int) -> float:
        if not self.broken or t <= self.a1:
            return PLOT_X0 + (t - self.a0) * (self.xa1 - PLOT_X0) / max(self.a1 - self.a0, 1)
        if t >= self.b0:
            return self.xb0 + (t - self.b0) * (PLOT_X1 - self.xb0) / max(self.ref - self.b0, 1)
        return self.xa1 + (t - self.a1) * (self.xb0 - self.xa1) / max(self.b0 - self.a1, 1)

    def ticks(self) -> list[tuple[float, str]]:
        """(x, label) at round offsets from the reference (``−10 min``, ``−7 min 30 s`` …
        ``0 (dump)``). When the window sits far before it (a dump long after the hang), the
        first tick says how far in people's units (``−10 min 0 s``) and the others count on
        from it (``+0.2 ms``), instead of ten-digit labels like ``−600.00075 s``."""
        lo, hi = self.a0, (self.a1 if self.broken else self.ref)
        span_s = max(hi - lo, 1) / 1e9
        raw = span_s / 6
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
        if raw >= 30:  # minutes and hours in round steps (2 min, 5 min, 1 h), not 200 s
            step = next((m for m in _CLOCK_STEPS_S if m >= raw), step)
        first = math.ceil((lo - self.ref) / 1e9 / step)
        last = math.floor((hi - self.ref) / 1e9 / step)
        biggest = max(abs((lo - self.ref) / 1e9), abs((hi - self.ref) / 1e9))
        out = []
        if biggest / step > 2000:
            unit, factor = _unit(step)
            for k in range(first, last + 1):
                t = self.ref + round(k * step * 1e9)
                if k == first:
                    text = fmt_rel((t - self.ref))
                else:
                    text = "+" + _label((k - first) * step, unit, factor, _decimals(step, factor)).lstrip("+")
                out.append((self.x(t), text))
        else:
            unit, factor = ("ms", 1e3) if biggest < 1 else ("s", 1.0)
            decimals = _decimals(step, factor)
            for k in range(first, last + 1):
                v = k * step
                t = self.ref + round(v * 1e9)
                text = fmt_rel(v * 1e9) if step >= 60 else _label(v, unit, factor, decimals)
                out.append((self.x(t), self.ref_label if k == 0 else text))
        if self.broken:  # none under the break's label; the dump itself is 0
            out = [(x, t) for x, t in out if x < self.xa1 - 34]
            out.append((self.x(self.ref), self.ref_label))
        return out


_CLOCK_STEPS_S = (30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def _unit(step_s: float) -> tuple[str, float]:
    if step_s < 1e-3:
        return "µs", 1e6
    if step_s < 1:
        return "ms", 1e3
    return "s", 1.0


def _decimals(step_s: float, factor: float) -> int:
    v = step_s * factor
    decimals = max(0, -math.floor(math.log10(v) + 1e-9))
    if round(v * 10**decimals, 6) % 1:
        decimals += 1
    return decimals


def _label(v_s: float, unit: str, factor: float, decimals: int) -> str:
    sign = "−" if v_s < 0 else "+"
    return f"{sign}{abs(v_s) * factor:.{decimals}f} {unit}"


# --------------------------------------------------------------------------- drawing


def _pack(lane: Lane, scale: _Scale, max_rows: int) -> None:
    """Sub-rows so overlapping bars (ops in flight on several groups) stay visible. The stuck
    collective and mismatches are placed first; what does not fit in ``max_rows`` becomes
    one "+N more" bar on the last row."""
    order = sorted(lane.bars, key=lambda b: (not (b.focus or b.mismatch == "odd"), b.kind == "ghost", b.start))
    placed, rest = _try_pack(order, scale, max_rows)
    if not rest:
        lane.rows = max(1, placed)
        return
    placed, rest = _try_pack(order, scale, max_rows - 1)
    hidden = {id(b) for b in rest}
    lane.bars = [b for b in lane.bars if id(b) not in hidden]
    rest.sort(key=lambda b: b.start)
    ops = list(dict.fromkeys(b.label.split(" #")[0] for b in rest))
    lines = [f"{len(rest)} more on this lane (not enough room to draw them apart):"]
    lines += [b.title.split("\n")[0] + f" · enqueued {_first_rel(b, scale.ref)}" for b in rest[:30]]
    if len(rest) > 30:
        lines.append(f"… and {len(rest) - 30} more")
    lane.bars.append(Bar(
        start=min(b.start for b in rest), end=max(b.end for b in rest),
        kind="open" if all(b.kind == "open" for b in rest) else "done", group="", seq=-1,
        label=f"+{len(rest)} more: " + ", ".join(ops[:4]) + ("…" if len(ops) > 4 else ""),
        title="\n".join(lines), count=len(rest), row=max_rows - 1,
    ))
    lane.rows = max_rows


def _first_rel(b: Bar, ref: int) -> str:
    return fmt_rel(b.start - ref)


def _try_pack(order: list[Bar], scale: _Scale, max_rows: int) -> tuple[int, list[Bar]]:
    rows: list[list[tuple[float, float]]] = []
    rest: list[Bar] = []
    for b in order:
        x0 = scale.x(b.start)
        x1 = max(scale.x(b.end), x0 + 0.5)  # real extent: a bar drawn wider than it is may touch the next
        row = next((i for i, spans in enumerate(rows)
                    if all(x1 <= s0 + 0.5 or x0 >= s1 - 0.5 for s0, s1 in spans)), None)
        if row is None:
            if len(rows) >= max_rows:
                rest.append(b)
                continue
            row = len(rows)
            rows.append([])
        rows[row].append((x0, x1))
        b.row = row
    return len(rows), rest


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _text_fits(text: str, width: float, px: float = 6.1) -> str:
    n = int((width - 6) / px)
    if n < min(len(text), 8):
        return ""
    return text if len(text) <= n else text[: n - 1] + "…"


def render_timeline(f: Facts) -> str:
    """The timeline section's SVG (empty string when the dumps hold no times)."""
    if f.ref is None:
        return ""
    ref = f.ref
    expanded, folded = _choose_lanes(f)
    start = _window_start(f, expanded + [r for _, rs in folded for r in rs[:8]])
    if start is None:
        return ""
    lanes = [_lane_for_rank(f, r, start, ref) for r in expanded]
    lanes += [_summary_lane(f, what, rs, start, ref) for what, rs in folded]
    hi = start
    for lane in lanes:
        for b in lane.bars:
            if b.kind != "ghost":
                hi = max(hi, b.start, b.end if b.kind != "open" else b.start)
    scale = _Scale(start, hi, ref, "0 (dump)" if f.verdict.reference_source == "dump_files" else "0")
    max_rows = max(2, min(7, ROW_BUDGET // max(1, len(lanes)) // ROW_H))
    for lane in lanes:
        _pack(lane, scale, max_rows)

    # Colour by group; groups of one kind (same desc: the 128 "tp" groups) share a colour.
    family = _families(f.job)
    colour_keys: list[str] = []
    group_ids: dict[str, int] = {}
    for lane in lanes:
        for b in lane.bars:
            if b.group:
                group_ids.setdefault(b.group, len(group_ids))
                key = family.get(b.group, b.group)
                if key not in colour_keys and b.kind in ("done", "est") and not b.mismatch:
                    colour_keys.append(key)
    by_colour = len(colour_keys) <= len(GROUP_COLOURS)
    colour_of = {g: GROUP_COLOURS[colour_keys.index(family.get(g, g))]
                 if by_colour and family.get(g, g) in colour_keys else NEUTRAL_COLOUR for g in group_ids}

    parts: list[str] = []
    y = AXIS_H
    lane_ys = []
    min_rows = 2 if len(lanes) <= 16 else 1  # room for the label's second line
    for lane in lanes:
        lane.rows = max(lane.rows, min_rows)
        h = lane.rows * ROW_H + 2 * LANE_PAD
        lane_ys.append((y, h))
        y += h
    height = y + 8
    parts.append(
        f'<svg id="timeline" class="timeline" viewBox="0 0 {WIDTH} {height}" '
        f'width="100%" role="img" aria-labelledby="tl-title" preserveAspectRatio="xMinYMin meet" '
        f'font-family="system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif" font-size="11">'
    )
    parts.append(f'<title id="tl-title">Timeline of the last collectives on {len(lanes)} lanes; time relative to the '
                 f'reference (0)</title>')
    # Lane backgrounds.
    for i, (lane, (ly, lh)) in enumerate(zip(lanes, lane_ys)):
        cls = "lane" + (" lane-culprit" if lane.culprit else "") + (" lane-summary" if lane.summary else "") + (
            " lane-alt" if i % 2 else "")
        parts.append(f'<rect class="{cls}" x="0" y="{ly}" width="{WIDTH}" height="{lh}"/>')
    # Break band, grid, ticks.
    if scale.broken:
        bx0, bx1 = scale.xa1 + 2, scale.xb0 - 2
        parts.append(f'<rect class="break" x="{_fmt(bx0)}" y="{AXIS_H - 6}" width="{_fmt(bx1 - bx0)}" '
                     f'height="{height - AXIS_H - 2}"/>')
        gap = ref - scale.a1
        parts.append(f'<text class="break-label" x="{_fmt((bx0 + bx1) / 2)}" y="{AXIS_H - 12}" '
                     f'text-anchor="middle">… {esc(fmt_duration(gap))} …</text>')
        for bx in (bx0, bx1):
            parts.append(f'<path class="break-mark" d="M{_fmt(bx - 3)} {AXIS_H + 2} l6 -10"/>')
    for x, text in scale.ticks():
        parts.append(f'<line class="grid" x1="{_fmt(x)}" x2="{_fmt(x)}" y1="{AXIS_H - 4}" y2="{height - 6}"/>')
        anchor = "end" if x > PLOT_X1 - 30 else "middle"
        parts.append(f'<text class="tick" x="{_fmt(x)}" y="{AXIS_H - 12}" text-anchor="{anchor}">{esc(text)}</text>')
    parts.append(f'<line class="axis" x1="{PLOT_X0}" x2="{PLOT_X1}" y1="{AXIS_H - 4}" y2="{AXIS_H - 4}"/>')
    # The stuck collective: where it was first enqueued.
    main = f.stuck[f.focus] if f.focus is not None else None
    if main is not None and main.since is not None and f.focus is not None:
        fx = scale.x(main.since)
        parts.append(f'<line class="focus-line" x1="{_fmt(fx)}" x2="{_fmt(fx)}" y1="{AXIS_H - 4}" '
                     f'y2="{height - 6}"><title>{esc(main.op or "collective")} #{f.focus[1]} on '
                     f'{esc(f.group_label(f.focus[0]), 120)} first enqueued {esc(fmt_rel(main.since - ref))}</title></line>')
    rx = scale.x(ref)
    parts.append(f'<line class="ref-line" x1="{_fmt(rx)}" x2="{_fmt(rx)}" y1="{AXIS_H - 4}" y2="{height - 6}"/>')

    for lane, (ly, lh) in zip(lanes, lane_ys):
        cls = "ll culprit" if lane.culprit else "ll summary" if lane.summary else "ll"
        sub = lane.sub
        parts.append(f'<g class="lane-label"><title>{esc(lane.title, 600)}</title>')
        if lane.rows > 1:
            note = f'<tspan class="ls" dx="6">{esc(lane.note, 40)}</tspan>' if lane.note else ""
            parts.append(f'<text class="{cls}" x="10" y="{ly + LANE_PAD + 11}">{esc(lane.label, 40)}{note}</text>'
                         f'<text class="ls" x="10" y="{ly + LANE_PAD + 24}">{esc(_text_fits(sub, LABEL_W - 8, 5.4))}</text>')
        else:  # one row: the sub-label goes beside the name, keeping the lane compact
            room = LABEL_W - 16 - 7 * len(lane.label)
            parts.append(f'<text class="{cls}" x="10" y="{ly + LANE_PAD + 11}">{esc(lane.label, 40)}'
                         f'<tspan class="ls" dx="6">{esc(_text_fits(sub, room, 5.4))}</tspan></text>')
        parts.append("</g>")
        if lane.missing:
            parts.append(f'<rect class="nodump" x="{PLOT_X0}" y="{ly + LANE_PAD}" width="{PLOT_X1 - PLOT_X0}" '
                         f'height="{BAR_H}"/><text class="nodump-label" x="{PLOT_X0 + 8}" y="{ly + LANE_PAD + 9}">'
                         f'no dump from {"these ranks" if lane.summary else "this rank"}</text>')
        for b in lane.bars:
            parts.append(_bar_svg(b, scale, ly + LANE_PAD + b.row * ROW_H, colour_of, group_ids))
    parts.append("</svg>")
    kinds = {b.kind for lane in lanes for b in lane.bars}
    legend = _legend(f, [(_colour_label(f, k), GROUP_COLOURS[i]) for i, k in enumerate(colour_keys)]
                     if by_colour else [], kinds, scale, ref)
    return "".join(parts) + legend


def _colour_label(f: Facts, key: str) -> str:
    if key.startswith("desc:"):
        desc = key[5:]
        n = sum(1 for g in f.job.groups.values() if g.desc == desc)
        return f"{desc} ({n} groups)"
    return f.group_label(key)


def _bar_svg(b: Bar, scale: _Scale, y: float, colour_of: dict[str, str], group_ids: dict[str, int]) -> str:
    x0 = scale.x(b.start)
    x1 = max(scale.x(b.end), x0 + 2)
    w = x1 - x0
    cls = ["bar", b.kind]
    if b.focus:
        cls.append("focus")
    if b.mismatch:
        cls.append("mm-" + b.mismatch)
    if b.count:
        cls.append("agg")
    colour = ""
    if b.kind in ("done", "est") and not b.mismatch:
        c = colour_of.get(b.group, NEUTRAL_COLOUR)
        colour = f' fill="{c}"'
    key = f"{group_ids[b.group]}:{b.seq}" if b.group in group_ids and b.seq >= 0 else ""
    out = [f'<g class="{" ".join(cls)}" data-k="{key}" tabindex="0"><title>{esc(b.title, 900)}</title>']
    out.append(f'<rect x="{_fmt(x0)}" y="{_fmt(y)}" width="{_fmt(w)}" height="{BAR_H}" rx="2"{colour}/>')
    if b.kind == "open":
        out.append(f'<path class="arrow" d="M{_fmt(x1)} {_fmt(y - 1)} l5 {(BAR_H + 2) / 2:g} l-5 {(BAR_H + 2) / 2:g}z"/>')
    if b.clipped:
        out.append(f'<path class="clip-mark" d="M{_fmt(x0 + 5)} {_fmt(y + 1)} l-4 {BAR_H / 2 - 1:g} l4 {BAR_H / 2 - 1:g}"/>')
    label = b.label
    if b.mismatch == "odd":
        label = "≠ " + label
    text = _text_fits(label, w)
    if text:
        out.append(f'<text class="bl" x="{_fmt(x0 + 4)}" y="{_fmt(y + BAR_H - 2.5)}">{esc(text)}</text>')
    elif (b.focus or b.mismatch == "odd") and x0 - PLOT_X0 > 6.1 * len(label) + 8:
        # Too narrow to hold its name, and it matters: the name goes to its left.
        out.append(f'<text class="bl outside" x="{_fmt(x0 - 4)}" y="{_fmt(y + BAR_H - 2.5)}" '
                   f'text-anchor="end">{esc(label)}</text>')
    out.append("</g>")
    return "".join(out)


def _legend(f: Facts, colours: list[tuple[str, str]], kinds: set[str], scale: _Scale, ref: int) -> str:
    items = []

    def swatch(cls: str, text: str, fill: str = "") -> None:
        fill_attr = f' fill="{fill}"' if fill else ""
        items.append(f'<span class="lg"><svg width="22" height="12" aria-hidden="true"><g class="bar {cls}">'
                     f'<rect x="1" y="1" width="20" height="10" rx="2"{fill_attr}/></g></svg>{text}</span>')

    if colours:
        for text, colour in colours:
            swatch("done", esc(text, 60), colour)
    elif "done" in kinds or "est" in kinds:
        swatch("done", "done", NEUTRAL_COLOUR)
    if "est" in kinds:
        swatch("est", "end estimated (no completion time recorded: the next enqueue)", NEUTRAL_COLOUR)
    if "open" in kinds:
        swatch("open", "in flight at the reference time (never completed)")
    if f.stuck:
        swatch("open focus", "the collective the job is stuck in (red outline)")
    if any(info.not_entered for info in f.stuck.values()):
        swatch("ghost focus", "never enqueued it")
    if f.mismatch_at:
        swatch("done mm-odd", "mismatch: the minority's call")
    where = {"dump_files": "when the dumps were written (file times)",
             "latest_activity": "the newest activity recorded in any dump"}.get(f.verdict.reference_source, "")
    note = f"Time 0 = {where}." if where else "Time 0 = the reference time."
    if scale.broken:
        note += f" The axis skips {esc(fmt_duration(ref - scale.a1))} of inactivity."
    note += " Times are each host's wall clock. Hover a bar for details; the same collective lights up on every lane."
    return f'<div class="legend">{"".join(items)}</div><p class="legend-note">{note}</p>'
