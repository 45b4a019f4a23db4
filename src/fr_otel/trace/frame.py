"""What every span of one incident trace shares: its ids, its reference time, its resources.

Spans are built as ``ReadableSpan`` objects directly: past events with their own times
and deterministic ids, no tracer, sampler or span limits (caps are ours).
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags

from ..diagnosis.job import Job
from ..diagnosis.verdict import Verdict, reference_ns
from ..read.dump import Entry
from ..version import __version__
from . import attributes as A
from .ids import span_id_for
from .options import DEFAULT_SERVICE_NAME, TraceOptions

__all__ = ["MAX_ATTRIBUTE_CHARS", "SCOPE", "TraceFrame", "clip", "span_name"]

MAX_ATTRIBUTE_CHARS = 2000  # Tempo truncates beyond 2048 bytes by default
SCOPE = InstrumentationScope("fr_otel", __version__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


@dataclass(frozen=True, slots=True)
class TraceFrame:
    """The incident, its trace id and the reference time ("now": when the dumps were taken)."""

    job: Job
    verdict: Verdict
    options: TraceOptions
    trace_id: int
    job_id: str
    now: int
    root_id: int
    base_resource: Resource  # service.name, for every span
    job_resource: Resource  # the analysis's own: root and collective spans

    @classmethod
    def of(cls, job: Job, verdict: Verdict, options: TraceOptions, trace_id: int, job_id: str) -> TraceFrame:
        base = Resource.create({"service.name": options.service_name} if options.service_name else {})
        if base.attributes.get("service.name", "").startswith("unknown_service"):
            base = base.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
        return cls(
            job=job,
            verdict=verdict,
            options=options,
            trace_id=trace_id,
            job_id=job_id,
            now=reference_ns(verdict, job),
            root_id=span_id_for(trace_id, "incident"),
            base_resource=base,
            job_resource=base.merge(Resource({"service.instance.id": f"{job_id}/analysis", A.JOB_ID: job_id})),
        )

    def context(self, span_id: int) -> SpanContext:
        """The context of this trace's span ``span_id`` (sampled: every span is exported)."""
        return SpanContext(self.trace_id, span_id, is_remote=False, trace_flags=_SAMPLED)


def clip(text: str, limit: int = MAX_ATTRIBUTE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def span_name(e: Entry) -> str:
    """Low-cardinality: ``nccl:send 0->3`` becomes ``nccl:send``."""
    return e.profiling_name.split(" ", 1)[0][:128]
