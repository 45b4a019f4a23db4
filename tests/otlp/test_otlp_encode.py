"""The direct OTLP encoder writes exactly the SDK's bytes, chunks them, and the export path uses it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from fr_otel import analyze, build_job, read_dumps
from fr_otel.otlp.config import resolve_export_config
from fr_otel.otlp.encode import Unencodable, encode_chunks, encode_request
from fr_otel.otlp.export import export_spans
from fr_otel.trace.spans import TraceOptions, build_trace
from fr_otel.testing.otlp import OtlpGrpcReceiver
from fr_otel.testing.spans import synthetic_spans

TRACE = 0x0123456789ABCDEF0123456789ABCDEF


def _ctx(span_id: int, *, remote: bool = False, state: TraceState | None = None) -> SpanContext:
    return SpanContext(TRACE, span_id, is_remote=remote, trace_flags=TraceFlags(1), trace_state=state)


def _odd_spans() -> list[ReadableSpan]:
    """Every value type and message part the SDK encodes, across interleaved resources and scopes."""
    r1 = Resource({"service.name": "a", "rank": 1, "ratio": 0.5, "flag": False, "tags": ["x", "y"]}, "https://s/1")
    r1_again = Resource({"service.name": "a", "rank": 1, "ratio": 0.5, "flag": False, "tags": ["x", "y"]}, "https://s/1")
    r2 = Resource({})
    s1 = InstrumentationScope("fr_otel", "1.2.3", "https://scope")
    s2 = InstrumentationScope("other", None)
    bounded = BoundedAttributes(maxlen=2, attributes={"a": 1, "b": 2, "c": 3})
    attrs = {
        "str": "héllo ✓", "empty": "", "int": 7, "zero": 0, "neg": -5, "min": -(1 << 63), "max": (1 << 63) - 1,
        "true": True, "false": False, "float": 1.5, "nan": math.nan, "negzero": -0.0, "bytes": b"\x00\xff",
        "ints": [1, 2, 3], "mixed": [1, "a", True, 2.5], "empty_list": [], "tuple": ("p", "q"), "long": "z" * 20000,
    }
    spans = [
        ReadableSpan("root", _ctx(1, state=TraceState([("k", "v"), ("k2", "w")])), None, resource=r1,
                     attributes=attrs, kind=SpanKind.SERVER, status=Status(StatusCode.ERROR, "bad"),
                     start_time=1, end_time=(1 << 64) - 1, instrumentation_scope=s1),
        ReadableSpan("child", _ctx(2), _ctx(1, remote=True), resource=r2, attributes=bounded,
                     events=[Event("e", {"x": 1}, timestamp=5), Event("bare", timestamp=6)],
                     links=[Link(_ctx(3, remote=True), {"l": "k"}), Link(_ctx(4))], kind=SpanKind.CLIENT,
                     status=Status(StatusCode.OK), start_time=2, end_time=3, instrumentation_scope=s2),
        ReadableSpan("again", _ctx(5), _ctx(1), resource=r1_again, attributes={"k": [True, False]},
                     kind=SpanKind.CONSUMER, start_time=4, end_time=5, instrumentation_scope=s1),
        ReadableSpan("noscope", _ctx(6), None, resource=r2, kind=SpanKind.PRODUCER, status=Status(StatusCode.UNSET),
                     start_time=0, end_time=0, instrumentation_scope=None),
        ReadableSpan("scope2-on-r1", _ctx(7), _ctx(1), resource=r1, attributes={},
                     kind=SpanKind.INTERNAL, start_time=9, end_time=9, instrumentation_scope=s2),
    ]
    return spans


def _all_spans(data: list[bytes]) -> list[tuple[bytes, bytes, bytes]]:
    """(resource, scope, span) bytes of every span in a list of serialized requests."""
    out = []
    for blob in data:
        for rs in ExportTraceServiceRequest.FromString(blob).resource_spans:
            for ss in rs.scope_spans:
                out += [(rs.resource.SerializeToString(), ss.scope.SerializeToString(), s.SerializeToString())
                        for s in ss.spans]
    return out


def test_direct_encoding_is_byte_identical_to_the_sdk_on_every_value_type() -> None:
    """Strings, ints at the int64 edges, bools, floats, bytes, arrays, events, links, states, grouping: same bytes."""
    spans = _odd_spans()
    assert encode_request(spans) == encode_spans(spans).SerializeToString()


def test_direct_encoding_is_byte_identical_to_the_sdk_on_a_real_full_incident_trace(nvrx: Path) -> None:
    """A --full trace of the real NCCL dumps (root, rank, entry and collective spans) encodes to the SDK's bytes."""
    job = build_job(read_dumps(nvrx / "lock_gil_1st"))
    trace = build_trace(job, analyze(job), TraceOptions(full=True))
    assert len(trace.spans) > 100
    assert encode_request(trace.spans) == encode_spans(trace.spans).SerializeToString()


def test_chunks_stay_under_the_limit_and_hold_the_sdk_spans_in_order() -> None:
    """Cut at 8 KiB, every chunk fits, parses, and together they carry the SDK's spans in its order."""
    spans = synthetic_spans(300, ranks=5) + _odd_spans()[1:]
    chunks = encode_chunks(spans, 8 * 1024)
    assert len(chunks) > 5
    assert all(len(c.data) <= 8 * 1024 for c in chunks if c.n_spans > 1)
    assert sum(c.n_spans for c in chunks) == len(spans)
    assert _all_spans([c.data for c in chunks]) == _all_spans([encode_spans(spans).SerializeToString()])


def test_values_the_sdk_path_must_handle_are_refused_and_the_export_falls_back() -> None:
    """An int beyond int64 is Unencodable here; export_spans then uses the SDK and still delivers every span."""
    spans = synthetic_spans(4)
    huge = ReadableSpan("huge", _ctx(99), None, resource=Resource({}), attributes={"ok": 1},
                        start_time=1, end_time=2)
    huge._attributes = {"big": 1 << 70}  # as a careless caller could build it
    with pytest.raises(Unencodable):
        encode_request([*spans, huge])
    with OtlpGrpcReceiver() as rx:
        result = export_spans(spans, resolve_export_config(endpoint=rx.url, environ={}), deadline_s=10,
                              spool_dir=None)
        assert result.ok and rx.span_count() == 4
