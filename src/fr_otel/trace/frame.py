"""What every span of one incident trace shares: its ids, its reference time, its resources.

Spans are built as ``ReadableSpan`` objects directly: past events with their own times
and deterministic ids, no tracer, sampler or span limits (caps are ours).
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.sdk.version import __version__ as _SDK_VERSION
from opentelemetry.trace import SpanContext, TraceFlags

from ..common.ids import span_id_for
from ..diagnosis.job import Job
from ..diagnosis.verdict import Verdict, reference_ns
from ..read.dump import Entry
from ..version import __version__
from . import attributes as A
from .options import DEFAULT_SERVICE_NAME, TraceOptions

__all__ = ["SCOPE", "TraceFrame", "base_resource", "span_name"]

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
        base = base_resource(options.service_name)
        return cls(
            job=job,
            verdict=verdict,
            options=options,
            trace_id=trace_id,
            job_id=job_id,
            now=reference_ns(verdict, job),
            root_id=span_id_for(trace_id, *_salt(options), "incident"),
            base_resource=base,
            job_resource=base.merge(Resource({"service.instance.id": f"{job_id}/analysis", A.JOB_ID: job_id})),
        )

    def span_id(self, *key: object) -> int:
        """The id of this trace's span named by ``key``: every rank derives the same, and each root
        of a trace with several (nodes that lost the store) has its own."""
        return span_id_for(self.trace_id, *_salt(self.options), *key)

    def context(self, span_id: int) -> SpanContext:
        """The context of this trace's span ``span_id`` (sampled: every span is exported)."""
        return SpanContext(self.trace_id, span_id, is_remote=False, trace_flags=_SAMPLED)


def _salt(options: TraceOptions) -> tuple[str, ...]:
    return (options.root_key,) if options.root_key else ()


def base_resource(service_name: str | None) -> Resource:
    """What every span's resource starts from: the SDK's identity, then ``OTEL_RESOURCE_ATTRIBUTES``
    and ``OTEL_SERVICE_NAME``, then an explicit service name (else fr-otel's default).

    Resolved here, in the calling thread, not by ``Resource.create``: that runs its detectors on a
    thread pool, which Python refuses once interpreter shutdown has begun — exactly when an exit
    hook exports an incident. It also skips the experimental detectors (the process detector
    would put the full command line, secrets and all, on every span)."""
    sdk = Resource({"telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry",
                    "telemetry.sdk.version": _SDK_VERSION})
    resource = sdk.merge(OTELResourceDetector().detect())
    if service_name:
        resource = resource.merge(Resource({"service.name": service_name}))
    if not resource.attributes.get("service.name"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    return resource


def span_name(e: Entry) -> str:
    """Low-cardinality: ``nccl:send 0->3`` becomes ``nccl:send``."""
    return e.profiling_name.split(" ", 1)[0][:128]
