"""Which ranks the timeline draws, and what each lane holds.

Small jobs get one lane per rank. With hundreds of ranks the culprits and a sample of the
ranks waiting on them keep their own lanes; the others are folded, by what they are doing,
into summary lanes that show the median rank (with counts). A lane's bars run from enqueue
to the end :func:`fr_otel.read.dump.op_interval` gives (the trace's spans end there too):
gloo records no completion time, so a completed gloo op's end is a bounded guess (marked as
estimated); an op still in flight runs, open, to the reference time. The
collective the job is stuck in is outlined on every lane, ranks that never enqueued it get
a dashed "ghost" where it would be, and the minority of a mismatch is marked.

Geometry (where a bar goes on the page) is :mod:`fr_otel.report.timeline`'s business.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from ..common.ranks import compress_ranks
from ..common.text import clip
from ..diagnosis.job import Job
from ..diagnosis.verdict import UNKNOWN_STALL
from ..read.dump import MAX_ESTIMATED_END_NS, Entry, op_interval
from .facts import Facts, history_at
from .markup import fmt_duration, fmt_rel

__all__ = ["Bar", "Lane", "Op", "families", "lanes_for"]

ALL_LANES_UP_TO = 32  # jobs this small get one lane per rank
MAX_EXPANDED = 24  # otherwise: culprits + a sample of waiting ranks, at most this many lanes
MAX_CULPRIT_LANES = 16
MAX_SUMMARY_LANES = 6
HISTORY_PER_LANE = 16  # recent entries per expanded lane that set the time window
MAX_BARS_PER_LANE = 240


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
class Bar:
    """One bar of a lane: an op (or, on a summary lane, ops of several ranks) in time."""

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
    """One row of the timeline: a rank, or several folded into one summary lane."""

    label: str
    sub: str
    title: str
    culprit: bool = False
    summary: bool = False
    missing: bool = False
    bars: list[Bar] = field(default_factory=list)
    rows: int = 1
    note: str = ""  # after the label, dimmed


def lanes_for(f: Facts) -> tuple[int, list[Lane]] | None:
    """(window start, lanes): the ranks with their own lane first, then the summary lanes;
    None when the dumps hold no times to draw."""
    if f.ref is None:
        return None
    expanded, folded = _choose_lanes(f)
    start = _window_start(f, expanded + [r for _, rs in folded for r in rs[:8]])
    if start is None:
        return None
    lanes = [_lane_for_rank(f, r, start, f.ref) for r in expanded]
    lanes += [_summary_lane(f, what, rs, start, f.ref) for what, rs in folded]
    return start, lanes


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
            at = history_at(f.job.dumps.get(r), *f.focus)
            if at is not None and at[1] > 0:
                starts.append(at[1])
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
    for i, (created_ns, name, seq, done, fp, entry) in enumerate(rows):
        nxt = d.next_enqueue_ns(entry.record_id) if entry is not None else None
        if nxt is None and i + 1 < len(rows):
            nxt = rows[i + 1][0]  # an op known by its columns only: the next one shown
        group_next = (None if (entry is not None and entry.is_p2p)
                      else partial(f.job.first_enqueue, name, seq + 1))
        _, end, est, open_ = op_interval(created_ns, done, ref,
                                         completed_ns=entry.time_completed_ns if entry else None,
                                         duration_ms=entry.duration_ms if entry else None, next_created_ns=nxt,
                                         group_next_ns=group_next)
        if created_ns < start and end <= start:
            continue
        if entry is not None:
            op, pname, p2p = entry.op, entry.profiling_name, entry.is_p2p
        else:
            fpt = d.fingerprints.get(fp)
            op = str(fpt[0]) if fpt else "collective"
            pname, p2p = prefix + op, False
        out.append(Op(name, seq, op, pname, created_ns, end, est, open_, created_ns < start, p2p, entry))
    return out


def _op_title(f: Facts, rank: int | None, o: Op, ref: int) -> str:
    who = f"rank {rank}: " if rank is not None else ""
    num = f"#{o.seq}" if not o.p2p else f"p2p #{o.seq}"
    lines = [f"{who}{o.name} {num} on {f.group_label(o.group)}", f"enqueued {fmt_rel(o.created - ref)}"]
    if o.open:
        age = f.verdict.age_ns(o.created)
        lines.append(f"in flight, never completed ({fmt_duration(age)} when dumped)" if age is not None else
                     f"in flight, never completed; {UNKNOWN_STALL}")
    elif o.est:
        lines.append(f"done; end estimated at {fmt_rel(o.end - ref)} (no completion time recorded: the next "
                     f"enqueue here or in the group, at most {fmt_duration(MAX_ESTIMATED_END_NS)})")
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
    family = families(f.job)
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


def families(job: Job) -> dict[str, str]:
    """Group name -> a key shared by every group with the same desc, when several have it."""
    by_desc: dict[str, list[str]] = {}
    for g in job.groups.values():
        if g.desc and g.desc != "undefined":
            by_desc.setdefault(g.desc, []).append(g.name)
    return {n: "desc:" + d for d, names in by_desc.items() if len(names) > 1 for n in names}

