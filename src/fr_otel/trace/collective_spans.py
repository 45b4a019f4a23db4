"""One span per collective in focus: the star every rank's entry span links to.

Its id is derived from (group name, desc, ``collective_seq_id``), so each rank's entry
span can link to it without knowing the others (a star, not N² edges). It spans first
enqueue to last completion and says which ranks entered, completed, or never arrived.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, Status, StatusCode

from ..common.ranks import compress_ranks
from ..diagnosis.kinds import CulpritKind
from ..read.dump import Entry
from . import attributes as A
from .frame import SCOPE, TraceFrame, span_name

__all__ = ["EntriesByCollective", "collective_span_id", "collective_spans"]

#: Per (group, seq): every rank's exported entry of that collective and the end its span got.
EntriesByCollective = dict[tuple[str, int], list[tuple[int, Entry, int]]]


def collective_span_id(frame: TraceFrame, group: str, seq: int) -> int:
    """The collective span's id, the same from every rank's side: the group as the job model keys
    it (its name, or :func:`~fr_otel.diagnosis.job.split_group_key` where one name holds several
    groups) and the sequence number. The desc is a label, not identity: it is not in the id."""
    return frame.span_id("collective", group, seq)


def collective_spans(frame: TraceFrame, collectives: EntriesByCollective) -> Iterable[ReadableSpan]:
    """The collective spans, in (group, seq) order."""
    verdict, job = frame.verdict, frame.job
    progress_of = {g.group.name: g.progress for g in verdict.groups}
    mismatched = {(c.group_name, c.collective_seq_id) for c in verdict.culprits if c.kind == CulpritKind.MISMATCH}
    for (group, seq), seen in sorted(collectives.items()):
        pg = job.groups.get(group)
        members = pg.ranks if pg is not None else tuple(sorted({r for r, _, _ in seen}))
        progress = progress_of.get(group, {})
        entered, completed, missing = [], [], []
        for r in members:
            p = progress.get(r)
            if p is None:
                if any(r == s for s, _, _ in seen):
                    entered.append(r)
                continue
            if p.enqueued >= seq:
                entered.append(r)
                if p.completed >= seq:
                    completed.append(r)
            else:
                missing.append(r)
        first = min(e.time_created_ns for _, e, _ in seen)
        all_done = bool(members) and len(completed) == len(members)
        end = max(end for _, _, end in seen) if all_done else max(frame.now, first)
        e0 = seen[0][1]
        attrs: dict[str, Any] = {
            A.SPAN_ROLE: "collective",
            A.PG_NAME: group,
            A.PG_DESC: e0.pg_desc,
            A.PG_SIZE: len(members),
            A.SEQ_ID: seq,
            A.OP: e0.op,
            A.ENTERED_RANKS: entered,
            A.COMPLETED_RANKS: completed,
            A.MISSING_RANKS: missing,
        }
        step = None  # the first entry whose rank counted steps and dates it
        for r, e, _ in seen:
            steps = job.dumps[r].steps
            step = steps.step_at(e.time_created_ns) if steps is not None else None
            if step is not None:
                break
        if step is not None:
            attrs[A.TRAINING_STEP] = step
        status = Status(StatusCode.UNSET)
        if (group, seq) in mismatched:
            attrs[A.MISMATCH] = True
            status = Status(StatusCode.ERROR, "ranks called different ops, sizes or dtypes")
        elif missing and not all_done:
            status = Status(StatusCode.ERROR, f"never arrived: ranks {compress_ranks(missing)}")
        yield ReadableSpan(
            name=span_name(e0),
            context=frame.context(collective_span_id(frame, group, seq)),
            parent=frame.context(frame.root_id),
            resource=frame.job_resource,
            attributes=A.bounded(attrs),
            kind=SpanKind.INTERNAL,
            status=status,
            start_time=first,
            end_time=end,
            instrumentation_scope=SCOPE,
        )
