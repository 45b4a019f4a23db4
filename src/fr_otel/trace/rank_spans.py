"""Each rank's timeline: a ``rank`` span (its own Resource) and one span per exported entry.

An entry span runs from enqueue to its end by :func:`fr_otel.read.dump.op_interval` (the
report's bars use the same rule) and links to its collective's span.
The ``rank`` span summarises the history left out and, for a culprit, where it is now.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from ..common.ranks import compress_ranks
from ..common.text import MAX_ATTRIBUTE_CHARS, clip
from ..diagnosis.focus import incident_focus
from ..diagnosis.verdict import UNKNOWN_STALL, Verdict
from ..read.dump import Entry
from ..read.frame import is_user_frame
from . import attributes as A
from .collective_spans import EntriesByCollective, collective_span_id
from .frame import SCOPE, TraceFrame, span_name
from .incident_span import cause_attributes, now_attributes

__all__ = ["RankSpans"]


class RankSpans:
    """Builds every rank's spans for one trace; collectives seen on the way are gathered for their own spans."""

    def __init__(self, frame: TraceFrame) -> None:
        self.frame = frame
        self.culprits = {c.rank: c for c in frame.verdict.culprits}
        self.stuck = _stuck_collectives(frame.verdict)
        self.collectives: EntriesByCollective = {}

    def spans(self, rank: int, chosen: Sequence[Entry]) -> tuple[list[ReadableSpan], int]:
        """The rank span then its entry spans, and when the first of them starts."""
        frame = self.frame
        dump = frame.job.dumps[rank]
        resource = self._resource(rank)
        rank_span_id = frame.span_id("rank", rank)
        out: list[ReadableSpan] = []
        start = min((e.time_created_ns for e in chosen), default=frame.now)
        for e in chosen:
            _, end, estimated, _ = e.interval(
                frame.now, next_created_ns=dump.next_enqueue_ns(e.record_id),
                group_next_ns=partial(frame.job.first_enqueue, e.pg_name, e.collective_seq_id + 1))
            span_id = frame.span_id("entry", rank, e.pg_name, e.record_id, e.collective_seq_id,
                                  e.p2p_seq_id, e.op_id)
            links = []
            if not e.is_p2p:
                self.collectives.setdefault((e.pg_name, e.collective_seq_id), []).append((rank, e, end))
                collective = collective_span_id(frame, e.pg_name, e.collective_seq_id)
                links.append(Link(frame.context(collective), {"fr_otel.link": "collective"}))
            out.append(self._entry_span(rank, e, span_id, rank_span_id, resource, end, estimated, links))
        out.insert(0, self._rank_span(rank, rank_span_id, resource, chosen, start))
        return out, start

    def _resource(self, rank: int) -> Resource:
        frame = self.frame
        dump = frame.job.dumps[rank]
        attrs: dict[str, Any] = {
            "service.instance.id": f"{frame.job_id}/rank-{rank}",
            A.RANK: rank,
            A.BACKEND: dump.backend,
            A.JOB_ID: frame.job_id,
        }
        if frame.job.world_size is not None:
            attrs[A.WORLD_SIZE] = frame.job.world_size
        process = frame.job.processes.get(rank)
        if process is not None and process.host:
            attrs[A.HOST_NAME] = process.host
        if process is not None and process.pid is not None:
            attrs[A.PROCESS_PID] = process.pid
        return frame.base_resource.merge(Resource(A.bounded(attrs)))

    def _entry_span(
        self, rank: int, e: Entry, span_id: int, parent_id: int, resource: Resource, end: int, estimated: bool,
        links: list[Link],
    ) -> ReadableSpan:
        pg = self.frame.job.groups.get(e.pg_name)
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
            A.INPUT_SIZES: clip(_sizes(e.input_sizes), MAX_ATTRIBUTE_CHARS),
            A.OUTPUT_SIZES: clip(_sizes(e.output_sizes), MAX_ATTRIBUTE_CHARS),
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
        steps = self.frame.job.dumps[rank].steps
        step = steps.step_at(e.time_created_ns) if steps is not None else None
        if step is not None:
            attrs[A.TRAINING_STEP] = step
        events: list[Event] = []
        status = Status(StatusCode.UNSET)
        if not e.completed:
            attrs[A.IN_FLIGHT] = True
            # Its age when dumped; undated dumps leave it unknown (UNKNOWN_STALL), never a few ms to
            # the newest activity. Past the timeout even then when that lower bound already is.
            age_ns = self.frame.verdict.age_ns(e.time_created_ns)
            at_least_ms = (self.frame.now - e.time_created_ns) / 1e6
            events.append(Event("never completed", {"fr_otel.age_ms": age_ns / 1e6} if age_ns is not None else {},
                                timestamp=end))
            stuck = self.stuck.get((e.pg_name, e.collective_seq_id)) if not e.is_p2p else None
            in_flight = f"in flight {age_ns / 1e9:.1f} s" if age_ns is not None else UNKNOWN_STALL
            if e.timeout_ms and at_least_ms > e.timeout_ms:
                attrs[A.PAST_TIMEOUT] = True
                attrs[A.ERROR_TYPE] = "timeout"
                status = Status(StatusCode.ERROR, f"in flight {'' if age_ns is not None else 'over '}"
                                f"{at_least_ms / 1e3:.1f} s, past its {e.timeout_ms / 1e3:.0f} s timeout")
            elif stuck is not None:
                # The incident is the reason: no need to wait for the 30-minute timeout to say so.
                attrs[A.ERROR_TYPE] = self.frame.verdict.verdict
                status = Status(StatusCode.ERROR, f"{in_flight}: {stuck}")
            if stuck is not None:
                attrs[A.STUCK] = True
        culprit = self.culprits.get(rank)
        if culprit is not None and culprit.group_name == e.pg_name:
            attrs[A.IS_CULPRIT] = True
        if e.frames:
            user = next((f for f in e.frames if is_user_frame(f.filename)), e.frames[0])
            attrs.update({A.CODE_FUNCTION: user.name, A.CODE_FILE: user.filename, A.CODE_LINE: user.line})
        if e.frames and (not e.completed or culprit is not None):
            # Full stacks where someone will read them: in-flight ops and the culprit's.
            frames = e.frames[: self.frame.options.max_stack_frames]
            attrs[A.STACK] = clip("\n".join(f"{f.filename}:{f.line} in {f.name}" for f in frames), MAX_ATTRIBUTE_CHARS)
            events.extend(
                Event("frame", A.bounded({A.CODE_FUNCTION: f.name, A.CODE_FILE: f.filename, A.CODE_LINE: f.line}),
                      timestamp=e.time_created_ns)
                for f in frames
            )
        return ReadableSpan(
            name=span_name(e),
            context=self.frame.context(span_id),
            parent=self.frame.context(parent_id),
            resource=resource,
            attributes=A.bounded(attrs),
            events=events,
            links=links,
            kind=SpanKind.INTERNAL,
            status=status,
            start_time=e.time_created_ns,
            end_time=end,
            instrumentation_scope=SCOPE,
        )

    def _rank_span(self, rank: int, span_id: int, resource: Resource, chosen: Sequence[Entry],
                   start: int) -> ReadableSpan:
        dump = self.frame.job.dumps[rank]
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
            attrs[A.CULPRIT_EVIDENCE] = clip(culprit.evidence, MAX_ATTRIBUTE_CHARS)
            attrs.update(cause_attributes(culprit))
            if culprit.stopped_after_s is not None:
                attrs[A.STOPPED_AFTER_S] = culprit.stopped_after_s
            status = Status(StatusCode.ERROR, f"culprit: {culprit.kind}")
            now = now_attributes(culprit.process, culprit.now, self.frame.options.max_stack_frames)
            attrs.update(now)
            if culprit.now is not None:
                events.append(Event("stack.now", now, timestamp=culprit.now.captured_ns or self.frame.now))
        if dump.steps is not None:
            attrs[A.TRAINING_STEP] = dump.steps.step
        return ReadableSpan(
            name="rank",
            context=self.frame.context(span_id),
            parent=self.frame.context(self.frame.root_id),
            resource=resource,
            attributes=A.bounded(attrs),
            events=events,
            kind=SpanKind.INTERNAL,
            status=status,
            start_time=start,
            end_time=max(self.frame.now, start),
            instrumentation_scope=SCOPE,
        )


def _stuck_collectives(verdict: Verdict) -> dict[tuple[str, int], str]:
    """(group, seq) of the collectives a hang or desync is about (:func:`incident_focus`) -> why."""
    if not verdict.verdict.stuck:
        return {}
    culprits = compress_ranks(c.rank for c in verdict.culprits)
    why = f"{verdict.verdict}, waiting for rank(s) {culprits}" if culprits else verdict.verdict
    return dict.fromkeys(incident_focus(verdict).all, why)


def _sizes(sizes: Sequence[Sequence[int]]) -> str:
    return ",".join("[" + ",".join(map(str, s)) + "]" for s in sizes)
