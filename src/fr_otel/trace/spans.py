"""Recorder entries become OpenTelemetry spans, one timeline per rank, linked across ranks.

Layout of one incident trace:

- a root ``fr_otel.incident`` span carrying the verdict (culprits, kinds, evidence);
- per rank, a ``rank`` span (its own Resource) summarising the history left out,
  and one span per recorder entry in focus: start = enqueue, end = completion
  (gloo records none: a bounded guess, see :func:`fr_otel.read.dump.op_interval`; in flight: the dump);
- per collective in focus, one ``collective`` span whose id every rank derives
  from (group name, desc, ``collective_seq_id``); each rank's entry span links to
  it (a star, not N² edges). It spans first enqueue to last completion and says
  which ranks entered, completed, or never arrived;
- in a job too large for a span per rank, only culprits and their peers get the
  spans above; every other rank is in a ``ranks`` span per group kind and state
  (:mod:`.aggregate_spans`), and the trace holds at most :data:`MAX_TRACE_SPANS`.

Which entries are in focus: :mod:`.selection`; shared ids, time and resources:
:mod:`.frame`; the spans: :mod:`.incident_span`, :mod:`.rank_spans`,
:mod:`.collective_spans`. No torch import.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from ..common.ids import trace_id_for
from ..common.progress import ProgressCallback
from ..diagnosis.job import Job
from ..diagnosis.verdict import Verdict
from . import attributes as A
from .aggregate_spans import aggregate_spans
from .collective_spans import collective_spans
from .frame import TraceFrame
from .ids import job_identity
from .incident_span import incident_span
from .options import (
    DEFAULT_LAST_N,
    DEFAULT_MAX_SPANS,
    DEFAULT_SERVICE_NAME,
    TraceOptions,
)
from .rank_spans import RankSpans
from .selection import MAX_TRACE_SPANS, select_entries

# TraceOptions and the defaults live in .options (light to import), the end-estimate bound in
# .rank_spans; re-exported here, where callers build traces.
__all__ = [
    "DEFAULT_LAST_N",
    "DEFAULT_MAX_SPANS",
    "DEFAULT_SERVICE_NAME",
    "MAX_TRACE_SPANS",
    "IncidentTrace",
    "TraceOptions",
    "build_trace",
]


@dataclass(slots=True)
class IncidentTrace:
    """The spans of one incident, and how they were identified and bounded."""

    trace_id: int
    job_id: str
    job_id_source: str
    spans: list[ReadableSpan]
    entries_total: int = 0
    entries_exported: int = 0
    last_n_used: int = 0
    notes: list[str] = field(default_factory=list)
    incident: str = ""  # the incident key the trace id was derived from (with job_id)
    root_attributes: tuple[tuple[str, Any], ...] = ()  # what the caller added to the root span

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"


def build_trace(
    job: Job, verdict: Verdict, options: TraceOptions | None = None, progress: ProgressCallback | None = None
) -> IncidentTrace:
    """All spans of the incident described by ``job`` and its ``verdict``; ``progress(ranks
    done, ranks)`` is called as each rank's spans are built."""
    options = options or TraceOptions()
    job_id, source = job_identity(options.job_id)
    if job_id is None:
        job_id, source = _derived_job_id(job), "dumps"
    trace_id = trace_id_for(job_id, options.incident)
    frame = TraceFrame.of(job, verdict, options, trace_id, job_id)
    selection = select_entries(job, verdict, options)
    selected = selection.entries
    ranks = RankSpans(frame)
    spans: list[ReadableSpan] = []
    first_start = frame.now
    for done, rank in enumerate(sorted(selected), 1):
        rank_spans, starts = ranks.spans(rank, selected[rank])
        spans.extend(rank_spans)
        first_start = min(first_start, starts)
        if progress is not None:
            progress(done, len(selected))
    spans.extend(collective_spans(frame, ranks.collectives))
    notes = selection.notes
    if selection.detailed is not None:
        spans.extend(aggregate_spans(frame, selection.detailed, ranks.collectives))
        spans = _capped(spans, notes)
    root_extra = {} if selection.detailed is None else {
        A.RANKS_IN_FULL: len(selection.detailed), A.RANKS_AGGREGATED: len(job.dumps) - len(selection.detailed)}
    spans.insert(0, incident_span(frame, first_start, selection.entries_total, notes, root_extra))
    return IncidentTrace(
        trace_id=trace_id,
        job_id=job_id,
        job_id_source=source,
        spans=spans,
        entries_total=selection.entries_total,
        entries_exported=sum(map(len, selected.values())),
        last_n_used=selection.last_n,
        notes=selection.notes,
        incident=options.incident,
        root_attributes=options.root_attributes,
    )


def _capped(spans: list[ReadableSpan], notes: list[str]) -> list[ReadableSpan]:
    """At most :data:`MAX_TRACE_SPANS` - 1 (the root comes on top): entry spans go first, the oldest of all
    ranks' first (spans are built rank by rank: dropping in list order would take rank 0's newest, the
    culprit's too, before another rank's oldest)."""
    over = len(spans) + 1 - MAX_TRACE_SPANS
    if over <= 0:
        return spans
    role = A.SPAN_ROLE
    entries = [i for i, sp in enumerate(spans) if (sp.attributes or {}).get(role) == "entry"]
    entries.sort(key=lambda i: spans[i].start_time or 0)  # stable: equal times keep their order
    drop = set(entries[:over])
    notes.append(f"{len(drop)} entry span(s) left out to keep the trace under {MAX_TRACE_SPANS} spans")
    return [sp for i, sp in enumerate(spans) if i not in drop]


def _derived_job_id(job: Job) -> str:
    """A content hash of the dumps: stable across re-exports of the same files."""
    h = hashlib.blake2b(digest_size=8)
    for rank in sorted(job.dumps):
        d = job.dumps[rank]
        h.update(f"{rank}:{d.version}:{d.entry_count}:{d.latest_ns};".encode())
    return f"dumps:{h.hexdigest()}"
