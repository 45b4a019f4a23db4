"""The root span of an incident trace: the verdict, its culprits and where each one is now."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanKind, Status, StatusCode

from ..common.ranks import compress_ranks
from ..common.text import MAX_ATTRIBUTE_CHARS, clip
from ..diagnosis.hosts import LOST_STATES
from ..diagnosis.restart import culprit_domain, hosts_to_exclude, verdict_action
from ..diagnosis.verdict import Culprit
from ..read.live_stack import LiveStacks
from ..read.rank_process import RankProcess
from . import attributes as A
from .frame import SCOPE, TraceFrame

__all__ = ["incident_span", "now_attributes"]


def incident_span(frame: TraceFrame, start: int, entries_total: int, notes: list[str],
                  extra: dict[str, Any] | None = None) -> ReadableSpan:
    """``fr_otel.incident``: from the first exported op to the reference time; ``notes`` and ``extra``
    attributes are the trace's own."""
    v = frame.verdict
    blamed = v.blamed  # ranks only reported (state unknown) are listed apart: never as culprits
    max_frames = frame.options.max_stack_frames
    attrs: dict[str, Any] = {
        A.SPAN_ROLE: "incident",
        A.VERDICT: v.verdict,
        A.CULPRIT_RANKS: [c.rank for c in blamed],
        A.CULPRIT_KINDS: [c.kind for c in blamed],
        A.CULPRIT_EVIDENCE: [clip(c.evidence, 500) for c in blamed[:32]],
        A.CULPRIT_CAUSES: [str(c.cause.cls) if c.cause is not None else "" for c in blamed],
        A.CULPRIT_DOMAINS: [str(culprit_domain(c)) for c in blamed],
        A.RANKS_LOADED: v.ranks_loaded,
        A.JOB_ID: frame.job_id,
        A.HISTORY_TOTAL: entries_total,
    }
    if v.world_size is not None:
        attrs[A.WORLD_SIZE] = v.world_size
    unknown = [c.rank for c in v.culprits if not c.blamed]
    if unknown:
        attrs[A.UNKNOWN_RANKS] = unknown
    if blamed:
        c = blamed[0]
        attrs[A.PG_NAME] = c.group_name
        attrs[A.PG_DESC] = c.group_desc
        if c.collective_seq_id is not None:
            attrs[A.SEQ_ID] = c.collective_seq_id
        if c.op:
            attrs[A.OP] = c.op
        step = c.collective_step if c.collective_step is not None else c.step
        if step is not None:
            attrs[A.TRAINING_STEP] = step
        attrs.update(now_attributes(c.process, c.now, max_frames))
    if any(c.host for c in blamed):
        attrs[A.CULPRIT_HOSTS] = [c.host or "" for c in blamed]
    if v.nodes:
        attrs[A.CULPRIT_NODES] = [f"{h}: {compress_ranks(r)}" for h, r in v.nodes]
    gone = [h for h in v.hosts if h.state in LOST_STATES]
    if gone:
        attrs[A.LOST_HOSTS] = [h.host for h in gone]
        attrs[A.HOST_FINDINGS] = [clip(h.sentence(), 500) for h in gone[:64]]
    action = verdict_action(v)
    if action is not None:
        attrs[A.ACTION] = str(action)
    exclude = hosts_to_exclude(v)
    if exclude:
        attrs[A.EXCLUDE_HOSTS] = list(exclude)
    if v.stop_order is not None and v.stop_order.first is not None:
        attrs[A.FIRST_STOPPED] = v.stop_order.first
    elif v.stop_order is not None and v.stop_order.points:
        attrs[A.STOP_ORDER_NOTE] = clip(v.stop_order.sentence(), 500)  # progress and time bound
    elif v.stop_order is not None and v.stop_order.note:
        attrs[A.STOP_ORDER_NOTE] = clip(v.stop_order.note, 500)
    attrs.update(extra or {})
    for key, value in frame.options.root_attributes:
        attrs.setdefault(key, value)
    all_notes = [*v.notes, *notes]
    if all_notes:
        attrs[A.NOTES] = [clip(n, 500) for n in all_notes[:16]]
    if v.problems:
        attrs[A.PROBLEMS] = [clip(p, 300) for p in v.problems[:16]]
    events = [
        Event(
            "culprit",
            A.bounded({A.RANK: c.rank, A.CULPRIT_KIND: c.kind, A.PG_NAME: c.group_name, A.PG_DESC: c.group_desc,
                       "message": c.evidence, **cause_attributes(c),
                       **now_attributes(c.process, c.now, max_frames)}),
            timestamp=frame.now,
        )
        for c in blamed[:64]
    ]
    bad = v.verdict.stuck
    status = (Status(StatusCode.ERROR, f"{v.verdict}: ranks {compress_ranks(c.rank for c in blamed)}") if bad
              else Status(StatusCode.UNSET))
    return ReadableSpan(
        name="fr_otel.incident",
        context=frame.context(frame.root_id),
        parent=None,
        resource=frame.job_resource,
        attributes=A.bounded(attrs),
        events=events,
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=start,
        end_time=max(frame.now, start),
        instrumentation_scope=SCOPE,
    )


def cause_attributes(c: Culprit) -> dict[str, Any]:
    """A culprit's cause: its class and evidence lines (none when no cause was named)."""
    if c.cause is None:
        return {}
    return {A.CULPRIT_CAUSE: str(c.cause.cls), A.CULPRIT_DOMAIN: str(c.cause.domain),
            A.CULPRIT_CAUSE_EVIDENCE: [clip(e, 500) for e in c.cause.evidence[:8]]}


def now_attributes(process: RankProcess | None, now: LiveStacks | None, max_frames: int) -> dict[str, Any]:
    """host.name, process.pid and where the main thread was at incident time (code.* of that frame)."""
    attrs: dict[str, Any] = {}
    if process is not None and process.host:
        attrs[A.HOST_NAME] = process.host
    if process is not None and process.pid is not None:
        attrs[A.PROCESS_PID] = process.pid
    where = now.where if now is not None else None
    if now is not None and where is not None:
        attrs[A.NOW] = clip(now.describe(), 500)
        attrs[A.STACK_NOW] = clip(now.text(max_frames), MAX_ATTRIBUTE_CHARS)
        attrs.update({A.CODE_FUNCTION: where.name, A.CODE_FILE: where.filename, A.CODE_LINE: where.line})
    return attrs
