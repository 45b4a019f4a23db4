"""One culprit's record: its evidence strongest first, each item said as the culprit's own is
(group desc and name, the call), where the rank runs and what it is doing now.

Split from :mod:`.analysis`, which decides who is to blame; this says what is known of each.
"""

from __future__ import annotations

from dataclasses import replace

from ..read.dump import op_name
from ..read.frame import Frame, is_user_frame
from ..read.live_stack import LiveStacks
from ..read.rank_process import RankProcess
from .job import Job
from .kinds import KIND_ORDER, CulpritKind
from .verdict import Culprit, Evidence

__all__ = ["SAME_WAVE_NS", "culprit_record"]

#: Waits on one culprit that began within this of its first are one wave (simulated 3D jobs: the pipeline and
#: tensor-parallel waits within 1 ms; the other replicas' optimizer waits ~0.5 s later; NVRx within 20 ms).
SAME_WAVE_NS = 100_000_000


def culprit_record(job: Job, rank: int, evidence: list[Evidence], explained: tuple[int, str] | None = None) -> Culprit:
    """The rank's record, strongest evidence first; ``explained``: (culprit, why) for an absent rank
    whose silence that culprit explains (kind ``unknown``)."""
    first = min((e.since_ns for e in evidence if e.since_ns), default=0)

    def later_wave(e: Evidence) -> bool:
        """Its waiters began waiting well after the culprit's first waiters did: a consequence (the other data-
        parallel replicas reaching their optimizer step, say), not where the critical path stopped."""
        return e.since_ns is not None and e.since_ns > 0 and e.since_ns - first > SAME_WAVE_NS
    ordered = sorted(
        evidence,
        key=lambda e: (KIND_ORDER.index(e.kind), not e.direct, not e.sole, later_wave(e), -len(e.waiting), e.seq or 0),
    )
    if explained is not None:
        head = ordered[0]
        ordered.insert(0, Evidence(CulpritKind.UNKNOWN, head.group, head.seq, explained[1], head.waiting, op=head.op,
                                   peer=head.peer))
    primary = ordered[0]
    pg = job.groups.get(primary.group)
    op = primary.op
    if op is None and primary.seq is not None:
        for r in (rank, *primary.waiting):
            found = job.entries_at(r, primary.group, primary.seq)
            if found:
                op = found[0].profiling_name
                break
    process = job.processes.get(rank)
    dump = job.dumps.get(rank)
    # A rank that said how it left was captured on its way out (its main thread in the agent's exit hook): where
    # it stopped is its exit record's (the cause says it), not that stack.
    now = dump.now if dump is not None and rank not in job.exits else None
    text = primary.text
    if now is not None and now.where is not None:
        text += " " + _now_sentence(rank, process, now, primary.kind, op, primary.seq)
    return Culprit(
        rank=rank,
        kind=primary.kind,
        group_name=primary.group,
        group_desc=pg.desc if pg else "",
        collective_seq_id=primary.seq,
        evidence=text,
        op=op,
        waiting_ranks=primary.waiting,
        last_frame=_last_user_frame(job, rank),
        related=tuple(_related(job, rank, e) for e in _dedupe_evidence(ordered[1:])),
        peer=primary.peer,
        process=process,
        now=now,
        waits_on=(explained[0],) if explained is not None else (),
        p2p=primary.p2p,
        record=dump.record if dump is not None else None,
    )


def _related(job: Job, rank: int, e: Evidence) -> Evidence:
    """Related evidence said as the culprit's own is: its group's desc, and its call where the
    entries name one (from tails and columns: a large job's full dumps stay unloaded)."""
    pg = job.groups.get(e.group)
    op = e.op
    if op is None and e.seq is not None:
        op = job.op_at((rank, *e.waiting), e.group, e.seq)
    return replace(e, desc=pg.desc if pg else "", op=op)


def _now_sentence(rank: int, process: RankProcess | None, now: LiveStacks, kind: CulpritKind, op: str | None,
                  seq: int | None) -> str:
    """"Now rank 2 (host vm, pid 4242) is in time.sleep at train.py:27 in main, not in all_reduce #26." """
    who = f"rank {rank} ({process.label})" if process is not None and process.label else f"rank {rank}"
    text = f"Now {who} is {now.describe()}"
    if kind == CulpritKind.NOT_ENQUEUED and op and now.in_collective is None:
        text += f", not in {op_name(op)}" + (f" #{seq}" if seq is not None else "")
    return text + "."


def _dedupe_evidence(items: list[Evidence]) -> list[Evidence]:
    seen = set()
    out = []
    for e in items:
        key = (e.kind, e.group, e.seq)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _last_user_frame(job: Job, rank: int) -> Frame | None:
    """The innermost frame outside torch of the rank's newest entry: where the user's code was."""
    dump = job.dumps.get(rank)
    if dump is None or not dump.has_frames:
        return None
    for e in reversed(dump.tail):  # the tail holds the newest entries
        if e.frames:
            return next((f for f in e.frames if is_user_frame(f.filename)), e.frames[0])
    return None
