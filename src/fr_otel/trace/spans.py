"""Recorder entries become OpenTelemetry spans, one timeline per rank, linked across ranks.

Layout of one incident trace:

- a root ``fr_otel.incident`` span carrying the verdict (culprits, kinds, evidence);
- per rank, a ``rank`` span (its own Resource) summarising the history left out,
  and one span per recorder entry in focus: start = enqueue, end = completion
  (or, for gloo which records none, the rank's next enqueue; in flight: the dump);
- per collective in focus, one ``collective`` span whose id every rank derives
  from (group name, desc, ``collective_seq_id``); each rank's entry span links to
  it (a star, not N² edges). It spans first enqueue to last completion and says
  which ranks entered, completed, or never arrived.

Spans are built as ``ReadableSpan`` objects directly: past events with their own
times and deterministic ids, no tracer, sampler or span limits (caps are ours).
No torch import.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from ..version import __version__
from ..common.progress import ProgressCallback
from ..common.ranks import compress_ranks
from ..diagnosis.analysis import Verdict
from ..diagnosis.job import Job
from ..diagnosis.verdict import reference_ns
from ..read.columns import TAIL_PER_GROUP
from ..read.dump import Entry
from ..read.live_stack import LiveStacks, is_library_frame
from ..read.rank_process import RankProcess
from . import attributes as A
from .ids import job_identity, span_id_for, trace_id_for
from .options import (
    DEFAULT_LAST_N,
    DEFAULT_MAX_SPANS,
    DEFAULT_SERVICE_NAME,
    TraceOptions,
)

# TraceOptions and the defaults live in .trace_options (light to import); re-exported here.
__all__ = ["TraceOptions", "IncidentTrace", "build_trace", "DEFAULT_SERVICE_NAME", "DEFAULT_LAST_N", "DEFAULT_MAX_SPANS"]

MAX_ATTRIBUTE_CHARS = 2000  # Tempo truncates beyond 2048 bytes by default
#: An estimated end (gloo records no completion time) never lies further than this after
#: the start, nor after the rank's or the group's next enqueue: a completed op must not
#: look stretched across the stall that followed it.
MAX_ESTIMATED_END_NS = 1_000_000_000
_SCOPE = InstrumentationScope("fr_otel", __version__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


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


def _clip(text: str, limit: int = MAX_ATTRIBUTE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _sizes(sizes: Sequence[Sequence[int]]) -> str:
    return ",".join("[" + ",".join(map(str, s)) + "]" for s in sizes)


def _span_name(e: Entry) -> str:
    """Low-cardinality: ``nccl:send 0->3`` becomes ``nccl:send``."""
    return e.profiling_name.split(" ", 1)[0][:128]


def _derived_job_id(job: Job) -> str:
    """A content hash of the dumps: stable across re-exports of the same files."""
    h = hashlib.blake2b(digest_size=8)
    for rank in sorted(job.dumps):
        d = job.dumps[rank]
        h.update(f"{rank}:{d.version}:{d.entry_count}:{d.latest_ns};".encode())
    return f"dumps:{h.hexdigest()}"


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
    builder = _Builder(job, verdict, options, trace_id, job_id)
    spans = builder.build(progress)
    return IncidentTrace(
        trace_id=trace_id,
        job_id=job_id,
        job_id_source=source,
        spans=spans,
        entries_total=builder.entries_total,
        entries_exported=builder.entries_exported,
        last_n_used=builder.last_n,
        notes=builder.notes,
        incident=options.incident,
        root_attributes=options.root_attributes,
    )


class _Builder:
    def __init__(self, job: Job, verdict: Verdict, options: TraceOptions, trace_id: int, job_id: str) -> None:
        self.job = job
        self.verdict = verdict
        self.options = options
        self.trace_id = trace_id
        self.job_id = job_id
        self.now = reference_ns(verdict, job)
        self.progress = {g.group.name: g.progress for g in verdict.groups}
        self.culprits = {c.rank: c for c in verdict.culprits}
        self.stuck = _stuck_collectives(verdict)
        self.group_next: dict[tuple[str, int], int] = {}  # (group, seq) -> first enqueue by any rank
        self.root_id = span_id_for(trace_id, "incident")
        self.notes: list[str] = []
        self.entries_total = 0
        self.entries_exported = 0
        self.last_n = options.last_n
        base = Resource.create({"service.name": options.service_name} if options.service_name else {})
        if base.attributes.get("service.name", "").startswith("unknown_service"):
            base = base.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
        self.base_resource = base
        self.job_resource = base.merge(Resource({"service.instance.id": f"{job_id}/analysis", A.JOB_ID: job_id}))

    # -- selection --------------------------------------------------------------

    def _focus_seqs(self) -> dict[str, set[int]]:
        focus: dict[str, set[int]] = {}
        for g in self.verdict.groups:
            f = g.in_flight
            if f is not None:
                focus.setdefault(g.group.name, set()).add(f.seq)
        for c in self.verdict.culprits:
            for group, seq in [(c.group_name, c.collective_seq_id), *((e.group, e.seq) for e in c.related)]:
                if seq is not None:
                    focus.setdefault(group, set()).update((seq - 1, seq))
        return focus

    def _select(self) -> dict[int, list[Entry]]:
        focus = self._focus_seqs()
        self.entries_total = sum(d.entry_count for d in self.job.dumps.values())
        if self.options.full:
            self.last_n = -1
            return {r: list(d.entries) for r, d in self.job.dumps.items()}
        budget = max(self.options.max_spans - 2 * len(self.job.dumps) - 1, 0)
        last_n = self.options.last_n
        while True:
            chosen = {r: self._select_rank(r, focus, last_n) for r in self.job.dumps}
            count = sum(map(len, chosen.values()))
            if count <= budget or last_n == 0:
                break
            last_n //= 2
        if last_n < self.options.last_n:
            self.notes.append(
                f"kept the last {last_n} collective(s) per group per rank (not {self.options.last_n}) to stay "
                f"under {self.options.max_spans} spans; culprits keep {self.options.last_n}"
            )
        self.last_n = last_n
        return chosen

    def _select_rank(self, rank: int, focus: dict[str, set[int]], last_n: int) -> list[Entry]:
        keep_n = self.options.last_n if rank in self.culprits else last_n
        dump = self.job.dumps[rank]
        # The tail (newest entries per group + everything in flight) usually covers the
        # focus; only older focus seqs (a mismatch deep in history) need the full dump.
        entries = dump.tail if keep_n <= TAIL_PER_GROUP else dump.entries
        recent: dict[str, int] = {}
        keep = [False] * len(entries)
        for i in range(len(entries) - 1, -1, -1):
            e = entries[i]
            seen = recent.get(e.pg_name, 0)
            if seen < keep_n or not e.completed or e.collective_seq_id in focus.get(e.pg_name, ()):
                keep[i] = True
            recent[e.pg_name] = seen + 1
        chosen = [e for e, k in zip(entries, keep) if k]
        if entries is dump.tail:
            have = {(e.pg_name, e.collective_seq_id) for e in chosen if not e.is_p2p}
            older = [
                e
                for group, seqs in focus.items()
                for seq in sorted(seqs)
                if (group, seq) not in have
                for e in self.job.entries_at(rank, group, seq)
            ]
            if older:
                chosen = sorted(chosen + older, key=lambda e: e.record_id)
        return chosen

    # -- spans --------------------------------------------------------------------

    def _ctx(self, span_id: int) -> SpanContext:
        return SpanContext(self.trace_id, span_id, is_remote=False, trace_flags=_SAMPLED)

    def build(self, progress: ProgressCallback | None = None) -> list[ReadableSpan]:
        selected = self._select()
        for chosen in selected.values():
            for e in chosen:
                if not e.is_p2p:
                    key = (e.pg_name, e.collective_seq_id)
                    self.group_next[key] = min(self.group_next.get(key, e.time_created_ns), e.time_created_ns)
        spans: list[ReadableSpan] = []
        collectives: dict[tuple[str, int], list[tuple[int, Entry, int]]] = {}
        first_start = self.now
        for done, rank in enumerate(sorted(selected), 1):
            rank_spans, starts = self._rank_spans(rank, selected[rank], collectives)
            spans.extend(rank_spans)
            first_start = min(first_start, starts)
            if progress is not None:
                progress(done, len(selected))
        spans.extend(self._collective_spans(collectives))
        spans.insert(0, self._root_span(first_start))
        self.entries_exported = sum(map(len, selected.values()))
        return spans

    def _root_span(self, start: int) -> ReadableSpan:
        v = self.verdict
        attrs: dict[str, Any] = {
            A.SPAN_ROLE: "incident",
            A.VERDICT: v.verdict,
            A.CULPRIT_RANKS: [c.rank for c in v.culprits],
            A.CULPRIT_KINDS: [c.kind for c in v.culprits],
            A.CULPRIT_EVIDENCE: [_clip(c.evidence, 500) for c in v.culprits[:32]],
            A.RANKS_LOADED: v.ranks_loaded,
            A.JOB_ID: self.job_id,
            A.HISTORY_TOTAL: self.entries_total,
        }
        if v.world_size is not None:
            attrs[A.WORLD_SIZE] = v.world_size
        if v.culprits:
            c = v.culprits[0]
            attrs[A.PG_NAME] = c.group_name
            attrs[A.PG_DESC] = c.group_desc
            if c.collective_seq_id is not None:
                attrs[A.SEQ_ID] = c.collective_seq_id
            if c.op:
                attrs[A.OP] = c.op
            step = c.collective_step if c.collective_step is not None else c.step
            if step is not None:
                attrs[A.TRAINING_STEP] = step
            attrs.update(_now_attributes(c.process, c.now, self.options.max_stack_frames))
        if any(c.host for c in v.culprits):
            attrs[A.CULPRIT_HOSTS] = [c.host or "" for c in v.culprits]
        if v.nodes:
            attrs[A.CULPRIT_NODES] = [f"{h}: {compress_ranks(r)}" for h, r in v.nodes]
        if v.stop_order is not None and v.stop_order.first is not None:
            attrs[A.FIRST_STOPPED] = v.stop_order.first
        elif v.stop_order is not None and v.stop_order.points:
            attrs[A.STOP_ORDER_NOTE] = _clip(v.stop_order.sentence(), 500)  # progress and time bound
        elif v.stop_order is not None and v.stop_order.note:
            attrs[A.STOP_ORDER_NOTE] = _clip(v.stop_order.note, 500)
        for key, value in self.options.root_attributes:
            attrs.setdefault(key, value)
        notes = [*v.notes, *self.notes]
        if notes:
            attrs[A.NOTES] = [_clip(n, 500) for n in notes[:16]]
        if v.problems:
            attrs[A.PROBLEMS] = [_clip(p, 300) for p in v.problems[:16]]
        events = [
            Event(
                "culprit",
                A.bounded({A.RANK: c.rank, A.CULPRIT_KIND: c.kind, A.PG_NAME: c.group_name, "message": c.evidence,
                           **_now_attributes(c.process, c.now, self.options.max_stack_frames)}),
                timestamp=self.now,
            )
            for c in v.culprits[:64]
        ]
        bad = v.verdict in ("hang", "desync")
        status = Status(StatusCode.ERROR, f"{v.verdict}: ranks {compress_ranks(c.rank for c in v.culprits)}") if bad else Status(StatusCode.UNSET)
        return ReadableSpan(
            name="fr_otel.incident",
            context=self._ctx(self.root_id),
            parent=None,
            resource=self.job_resource,
            attributes=A.bounded(attrs),
            events=events,
            kind=SpanKind.INTERNAL,
            status=status,
            start_time=start,
            end_time=max(self.now, start),
            instrumentation_scope=_SCOPE,
        )

    def _rank_resource(self, rank: int) -> Resource:
        dump = self.job.dumps[rank]
        attrs: dict[str, Any] = {
            "service.instance.id": f"{self.job_id}/rank-{rank}",
            A.RANK: rank,
            A.BACKEND: dump.backend,
            A.JOB_ID: self.job_id,
        }
        if self.job.world_size is not None:
            attrs[A.WORLD_SIZE] = self.job.world_size
        process = self.job.processes.get(rank)
        if process is not None and process.host:
            attrs[A.HOST_NAME] = process.host
        if process is not None and process.pid is not None:
            attrs[A.PROCESS_PID] = process.pid
        return self.base_resource.merge(Resource(A.bounded(attrs)))

    def _rank_spans(
        self, rank: int, chosen: list[Entry], collectives: dict[tuple[str, int], list[tuple[int, Entry, int]]]
    ) -> tuple[list[ReadableSpan], int]:
        dump = self.job.dumps[rank]
        resource = self._rank_resource(rank)
        rank_span_id = span_id_for(self.trace_id, "rank", rank)
        out: list[ReadableSpan] = []
        next_created = dump.next_created_ns
        if any(e.record_id not in next_created for e in chosen[:-1]):
            next_created = _next_created(dump.entries)
        start = min((e.time_created_ns for e in chosen), default=self.now)
        for e in chosen:
            end, estimated = self._end_of(e, next_created.get(e.record_id))
            if estimated and not e.is_p2p:
                end = min(end, max(self.group_next.get((e.pg_name, e.collective_seq_id + 1), end), e.time_created_ns))
            span_id = span_id_for(self.trace_id, "entry", rank, e.pg_name, e.record_id, e.collective_seq_id, e.p2p_seq_id, e.op_id)
            links = []
            if not e.is_p2p:
                key = (e.pg_name, e.collective_seq_id)
                collectives.setdefault(key, []).append((rank, e, end))
                links.append(Link(self._ctx(self._collective_id(e.pg_name, e.pg_desc, e.collective_seq_id)), {"fr_otel.link": "collective"}))
            out.append(self._entry_span(rank, e, span_id, rank_span_id, resource, end, estimated, links))
        out.insert(0, self._rank_span(rank, rank_span_id, resource, chosen, start))
        return out, start

    def _collective_id(self, name: str, desc: str, seq: int) -> int:
        return span_id_for(self.trace_id, "collective", name, desc, seq)

    def _end_of(self, e: Entry, next_created: int | None) -> tuple[int, bool]:
        span = e.interval(self.now, next_created_ns=next_created, otherwise_ns=self.now,
                          max_estimate_ns=MAX_ESTIMATED_END_NS)
        return span.end, span.estimated

    def _entry_span(
        self, rank: int, e: Entry, span_id: int, parent_id: int, resource: Resource, end: int, estimated: bool,
        links: list[Link],
    ) -> ReadableSpan:
        pg = self.job.groups.get(e.pg_name)
        attrs: dict[str, Any] = {
            A.SPAN_ROLE: "entry",
            A.RANK: rank,
            A.PG_NAME: e.pg_name,
            A.PG_DESC: e.pg_desc,
            A.OP: e.op,
            A.SEQ_ID: e.collective_seq_id,
            A.OP_ID: e.op_id,
            A.RECORD_ID: e.record_id,
            A.STATE: e.state,
            A.RETIRED: e.retired,
            A.COMPLETED: e.completed,
            A.IS_P2P: e.is_p2p,
            A.INPUT_SIZES: _clip(_sizes(e.input_sizes)),
            A.OUTPUT_SIZES: _clip(_sizes(e.output_sizes)),
            A.INPUT_DTYPES: list(e.input_dtypes),
            A.OUTPUT_DTYPES: list(e.output_dtypes),
            A.THREAD_NAME: e.thread_name,
        }
        if pg is not None:
            attrs[A.PG_SIZE] = len(pg.ranks)
        if e.is_p2p:
            attrs[A.P2P_SEQ_ID] = e.p2p_seq_id
        if e.thread_id.isdigit():
            attrs[A.THREAD_ID] = int(e.thread_id) & ((1 << 63) - 1)
        if e.timeout_ms is not None:
            attrs[A.TIMEOUT_MS] = e.timeout_ms
        if e.duration_ms is not None:
            attrs[A.DURATION_MS] = float(e.duration_ms)
        if estimated:
            attrs[A.END_ESTIMATED] = True
        steps = self.job.dumps[rank].steps
        step = steps.step_at(e.time_created_ns) if steps is not None else None
        if step is not None:
            attrs[A.TRAINING_STEP] = step
        events: list[Event] = []
        status = Status(StatusCode.UNSET)
        if not e.completed:
            attrs[A.IN_FLIGHT] = True
            age_ms = (self.now - e.time_created_ns) / 1e6
            events.append(Event("never completed", {"fr_otel.age_ms": age_ms}, timestamp=end))
            stuck = self.stuck.get((e.pg_name, e.collective_seq_id)) if not e.is_p2p else None
            if e.timeout_ms and age_ms > e.timeout_ms:
                attrs[A.PAST_TIMEOUT] = True
                attrs[A.ERROR_TYPE] = "timeout"
                status = Status(StatusCode.ERROR, f"in flight {age_ms / 1e3:.1f} s, past its {e.timeout_ms / 1e3:.0f} s timeout")
            elif stuck is not None:
                # The incident is the reason: no need to wait for the 30-minute timeout to say so.
                attrs[A.ERROR_TYPE] = self.verdict.verdict
                status = Status(StatusCode.ERROR, f"in flight {age_ms / 1e3:.1f} s: {stuck}")
            if stuck is not None:
                attrs[A.STUCK] = True
        culprit = self.culprits.get(rank)
        if culprit is not None and culprit.group_name == e.pg_name:
            attrs[A.IS_CULPRIT] = True
        if e.frames:
            user = next((f for f in e.frames if not is_library_frame(f.filename)), e.frames[0])
            attrs.update({A.CODE_FUNCTION: user.name, A.CODE_FILE: user.filename, A.CODE_LINE: user.line})
        if e.frames and (not e.completed or culprit is not None):
            # Full stacks where someone will read them: in-flight ops and the culprit's.
            frames = e.frames[: self.options.max_stack_frames]
            attrs[A.STACK] = _clip("\n".join(f"{f.filename}:{f.line} in {f.name}" for f in frames))
            events.extend(
                Event("frame", A.bounded({A.CODE_FUNCTION: f.name, A.CODE_FILE: f.filename, A.CODE_LINE: f.line}),
                      timestamp=e.time_created_ns)
                for f in frames
            )
        return ReadableSpan(
            name=_span_name(e),
            context=self._ctx(span_id),
            parent=self._ctx(parent_id),
            resource=resource,
            attributes=A.bounded(attrs),
            events=events,
            links=links,
            kind=SpanKind.INTERNAL,
            status=status,
            start_time=e.time_created_ns,
            end_time=end,
            instrumentation_scope=_SCOPE,
        )

    def _rank_span(self, rank: int, span_id: int, resource: Resource, chosen: list[Entry], start: int) -> ReadableSpan:
        dump = self.job.dumps[rank]
        histories = {n: h for n, h in dump.histories.items() if h.seq}
        kept: dict[str, int] = {}
        for e in chosen:
            kept[e.pg_name] = kept.get(e.pg_name, 0) + 1
        names = sorted(histories)
        attrs: dict[str, Any] = {
            A.SPAN_ROLE: "rank",
            A.RANK: rank,
            A.HISTORY_TOTAL: dump.entry_count,
            A.HISTORY_EXPORTED: len(chosen),
            A.HISTORY_GROUPS: names,
            A.HISTORY_FIRST_SEQ: [min(histories[n].seq) for n in names],
            A.HISTORY_LAST_SEQ: [max(histories[n].seq) for n in names],
            "fr_otel.history.exported_per_group": [kept.get(n, 0) for n in names],
        }
        status = Status(StatusCode.UNSET)
        culprit = self.culprits.get(rank)
        events: list[Event] = []
        if culprit is not None:
            attrs[A.IS_CULPRIT] = True
            attrs[A.CULPRIT_KIND] = culprit.kind
            attrs[A.CULPRIT_EVIDENCE] = _clip(culprit.evidence)
            if culprit.stopped_after_s is not None:
                attrs[A.STOPPED_AFTER_S] = culprit.stopped_after_s
            status = Status(StatusCode.ERROR, f"culprit: {culprit.kind}")
            now = _now_attributes(culprit.process, culprit.now, self.options.max_stack_frames)
            attrs.update(now)
            if culprit.now is not None:
                events.append(Event("stack.now", now, timestamp=culprit.now.captured_ns or self.now))
        if dump.steps is not None:
            attrs[A.TRAINING_STEP] = dump.steps.step
        return ReadableSpan(
            name="rank",
            context=self._ctx(span_id),
            parent=self._ctx(self.root_id),
            resource=resource,
            attributes=A.bounded(attrs),
            events=events,
            kind=SpanKind.INTERNAL,
            status=status,
            start_time=start,
            end_time=max(self.now, start),
            instrumentation_scope=_SCOPE,
        )

    def _collective_spans(self, collectives: dict[tuple[str, int], list[tuple[int, Entry, int]]]) -> Iterable[ReadableSpan]:
        mismatched = {(c.group_name, c.collective_seq_id) for c in self.verdict.culprits if c.kind == "mismatch"}
        for (group, seq), seen in sorted(collectives.items()):
            pg = self.job.groups.get(group)
            members = pg.ranks if pg is not None else tuple(sorted({r for r, _, _ in seen}))
            progress = self.progress.get(group, {})
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
            end = max(end for _, _, end in seen) if all_done else max(self.now, first)
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
            step = next((s for s in (self.job.dumps[r].steps.step_at(e.time_created_ns)  # type: ignore[union-attr]
                                     for r, e, _ in seen if self.job.dumps[r].steps is not None) if s is not None), None)
            if step is not None:
                attrs[A.TRAINING_STEP] = step
            status = Status(StatusCode.UNSET)
            if (group, seq) in mismatched:
                attrs[A.MISMATCH] = True
                status = Status(StatusCode.ERROR, "ranks called different ops, sizes or dtypes")
            elif missing and not all_done:
                status = Status(StatusCode.ERROR, f"never arrived: ranks {compress_ranks(missing)}")
            yield ReadableSpan(
                name=_span_name(e0),
                context=self._ctx(self._collective_id(group, e0.pg_desc, seq)),
                parent=self._ctx(self.root_id),
                resource=self.job_resource,
                attributes=A.bounded(attrs),
                kind=SpanKind.INTERNAL,
                status=status,
                start_time=first,
                end_time=end,
                instrumentation_scope=_SCOPE,
            )


def _stuck_collectives(verdict: Verdict) -> dict[tuple[str, int], str]:
    """(group, seq) of the collectives the incident is about -> why: a hang's or desync's
    oldest collective in flight in each group, and each culprit's."""
    if verdict.verdict not in ("hang", "desync"):
        return {}
    culprits = compress_ranks(c.rank for c in verdict.culprits)
    why = f"{verdict.verdict}, waiting for rank(s) {culprits}" if culprits else verdict.verdict
    out = {(g.group.name, g.in_flight.seq): why for g in verdict.groups if g.in_flight is not None}
    for c in verdict.culprits:
        if c.collective_seq_id is not None:
            out[(c.group_name, c.collective_seq_id)] = why
    return out


def _now_attributes(process: RankProcess | None, now: LiveStacks | None, max_frames: int) -> dict[str, Any]:
    """host.name, process.pid and where the main thread was at incident time (code.* of that frame)."""
    attrs: dict[str, Any] = {}
    if process is not None and process.host:
        attrs[A.HOST_NAME] = process.host
    if process is not None and process.pid is not None:
        attrs[A.PROCESS_PID] = process.pid
    where = now.where if now is not None else None
    if now is not None and where is not None:
        attrs[A.NOW] = _clip(now.describe(), 500)
        attrs[A.STACK_NOW] = _clip(now.text(max_frames))
        attrs.update({A.CODE_FUNCTION: where.name, A.CODE_FILE: where.filename, A.CODE_LINE: where.line})
    return attrs


def _next_created(entries: list[Entry]) -> dict[int, int]:
    """record_id -> when this rank enqueued its next op (an upper bound on completion)."""
    out: dict[int, int] = {}
    for a, b in zip(entries, entries[1:]):
        out[a.record_id] = b.time_created_ns
    return out
