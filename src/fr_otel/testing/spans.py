"""Synthetic spans for exporter tests: deterministic, collective-like, as big as asked.

They also smoke-test a real collector: send them, look them up by their ids.
"""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource as SdkResource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope as SdkScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

from ..common.ids import hashed_id

__all__ = ["synthetic_spans"]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def synthetic_spans(
    count: int,
    *,
    ranks: int = 4,
    trace_seed: str = "fr-otel-synthetic",
    attribute_bytes: int = 64,
    service_name: str = "fr-otel-synthetic",
) -> list[ReadableSpan]:
    """``count`` deterministic collective-like spans spread over ``ranks`` resources.

    Ids are blake2b hashes of ``trace_seed`` (never zero); each span has a parent and
    a link to its "collective" span, so id handling in links is exercised too.
    ``attribute_bytes`` pads one attribute to make spans bigger.
    """
    trace_id = hashed_id(f"{trace_seed}/trace", 16)
    root = SpanContext(trace_id, hashed_id(f"{trace_seed}/root", 8), is_remote=False, trace_flags=_SAMPLED)
    resources = [
        SdkResource({"service.name": service_name, "service.instance.id": f"rank-{r}", "pytorch.distributed.rank": r})
        for r in range(max(ranks, 1))
    ]
    scope = SdkScope("fr_otel.testing", "0")
    start = 1_700_000_000_000_000_000
    spans: list[ReadableSpan] = []
    for i in range(count):
        rank, seq = i % len(resources), i // len(resources)
        context = SpanContext(trace_id, hashed_id(f"{trace_seed}/{i}", 8), is_remote=False, trace_flags=_SAMPLED)
        collective = SpanContext(trace_id, hashed_id(f"{trace_seed}/c{seq}", 8), is_remote=False)
        spans.append(
            ReadableSpan(
                name="nccl:all_reduce",
                context=context,
                parent=root,
                resource=resources[rank],
                attributes={
                    "pytorch.distributed.rank": rank,
                    "pytorch.distributed.collective_seq_id": seq,
                    "fr_otel.testing.padding": "x" * attribute_bytes,
                },
                links=[Link(collective, {"pytorch.distributed.link": "collective"})],
                kind=SpanKind.INTERNAL,
                start_time=start + i * 1_000,
                end_time=start + i * 1_000 + 500,
                instrumentation_scope=scope,
            )
        )
    return spans
