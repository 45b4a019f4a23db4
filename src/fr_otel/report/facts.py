"""What the report knows about the job, computed once for every section and the timeline.

The verdict says who is to blame; the report also needs, per rank, what it is in flight
in, which collectives the job is stuck in, who entered them and since when. These come
from the dumps' columns and tails (always at hand): a full entry list is loaded only for a
stack, and only for the few ranks shown (:meth:`Facts.entry_at`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..diagnosis.focus import incident_focus
from ..diagnosis.job import Job, ProcessGroup
from ..diagnosis.kinds import CulpritKind
from ..diagnosis.verdict import Culprit, Verdict, reference_ns
from ..read.dump import Entry, RankDump, op_name

__all__ = ["Facts", "Pending", "Stuck", "history_at", "tail_entry"]

MAX_STUCK = 16  # collectives outlined as "stuck" (one per culprit)


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
    i = h.position(seq)
    if i is None:
        return None
    fp = dump.fingerprints.get(h.fingerprint[i])
    op = str(fp[0]) if fp else "collective"
    return op, h.created_ns[i], bool(h.completed[i])


@dataclass(slots=True)
class Pending:
    """The oldest collective of a group that ``rank`` enqueued and has not completed."""

    group: ProcessGroup
    seq: int
    op: str
    created_ns: int | None
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
        """The facts of ``job`` under ``verdict`` (the tails and columns only)."""
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
            if c.kind == CulpritKind.MISMATCH and c.collective_seq_id is not None:
                mismatch_at.setdefault((c.group_name, c.collective_seq_id), set()).add(c.rank)
            for ev in c.related:
                if ev.kind == CulpritKind.MISMATCH and ev.seq is not None:
                    mismatch_at.setdefault((ev.group, ev.seq), set()).add(c.rank)
        stuck = _stuck(job, verdict)
        waiting = tuple(sorted({w for c in verdict.culprits for w in c.waiting_ranks} - set(culprits)))
        everyone = set(job.dumps) | set(job.missing_ranks)
        for g in job.groups.values():
            everyone.update(g.ranks)
        ref = reference_ns(verdict, job) or None
        return cls(job, verdict, ref, pending, culprits, stuck, mismatch_at, waiting, tuple(sorted(everyone)))

    @property
    def focus(self) -> tuple[str, int] | None:
        """The main collective the job is stuck in (the first culprit's)."""
        return next(iter(self.stuck), None)

    def group_label(self, name: str) -> str:
        """The group as people know it (its desc and name), or the bare name if unknown."""
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

    def pending_in(self, rank: int, group: str) -> Pending | None:
        """The oldest collective ``rank`` has in flight on ``group``, if any."""
        return next((x for x in self.pending.get(rank, ()) if x.group.name == group), None)

    def entry_at(self, rank: int, group: str, seq: int) -> Entry | None:
        """The whole entry (stack included): from the tail, else from the rank's full dump
        (loaded here, on first use: only for the stacks shown)."""
        e = tail_entry(self.job.dumps.get(rank), group, seq)
        if e is not None:
            return e
        found = self.job.entries_at(rank, group, seq)
        return found[0] if found else None


@dataclass(slots=True)
class Stuck:
    """A collective the job is stuck in: who entered it, who never did, since when."""

    op: str | None
    entered: tuple[int, ...]
    not_entered: tuple[int, ...]
    since: int | None  # earliest enqueue among the ranks that entered it


def _stuck(job: Job, verdict: Verdict) -> dict[tuple[str, int], Stuck]:
    """The collectives the incident is mainly about (:func:`~fr_otel.diagnosis.focus.incident_focus`)."""
    by_name = {g.group.name: g for g in verdict.groups}
    ops: dict[tuple[str, int | None], str | None] = {}
    for c in verdict.culprits:
        ops.setdefault((c.group_name, c.collective_seq_id), c.op)
    out: dict[tuple[str, int], Stuck] = {}
    for key in incident_focus(verdict).main[:MAX_STUCK]:
        gs = by_name.get(key[0])
        fl = gs.in_flight if gs else None
        op = op_name(o) if (o := ops.get(key)) else o
        if fl is not None and fl.seq == key[1]:
            out[key] = Stuck(fl.op or op, fl.entered, fl.not_entered, fl.since_ns)
        else:
            out[key] = Stuck(op, (), (), None)
    return out
