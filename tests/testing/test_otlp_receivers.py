"""The loopback OTLP receivers in fr_otel.testing.otlp behave like real collectors."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.trace.export import SpanExportResult

from fr_otel.otlp.jsonl import request_to_json
from fr_otel.testing.otlp import OtlpGrpcReceiver, OtlpHttpReceiver, wait_for
from fr_otel.common.ports import unused_tcp_port
from fr_otel.testing.spans import synthetic_spans

SPANS = synthetic_spans(20, ranks=2)
REQUEST = encode_spans(SPANS)
SPAN_IDS = sorted(format(s.context.span_id, "016x") for s in SPANS)
TRACE_ID = format(SPANS[0].context.trace_id, "032x")


def grpc_export(rx: OtlpGrpcReceiver, request: ExportTraceServiceRequest = REQUEST, **kwargs: object) -> None:
    with grpc.insecure_channel(rx.endpoint) as channel:
        TraceServiceStub(channel).Export(request, timeout=5, **kwargs)


def http_post(url: str, body: bytes, content_type: str, encoding: str | None = None) -> int:
    headers = {"Content-Type": content_type}
    if encoding:
        headers["Content-Encoding"] = encoding
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


# --- gRPC -------------------------------------------------------------------------------


def test_grpc_receiver_stores_requests_and_flattens_spans() -> None:
    """An Export call over a real channel is stored; spans() keeps resource and scope."""
    with OtlpGrpcReceiver() as rx:
        assert rx.endpoint == f"127.0.0.1:{rx.port}" and rx.port > 0
        grpc_export(rx, metadata=(("x-tenant", "ml"),))
        assert rx.requests == [REQUEST]
        assert sorted(rx.span_ids()) == SPAN_IDS
        assert rx.trace_ids() == {TRACE_ID}
        received = rx.spans()
        assert {r.resource_attributes["service.instance.id"] for r in received} == {"rank-0", "rank-1"}
        assert {r.scope.name for r in received} == {"fr_otel.testing"}
        assert received[0].attributes["pytorch.distributed.collective_seq_id"] == 0
        assert rx.received_headers[0]["x-tenant"] == "ml"
        assert rx.request_sizes == [REQUEST.ByteSize()]


def test_grpc_receiver_accepts_the_sdk_exporter() -> None:
    """The SDK's own OTLP/gRPC exporter delivers to it: it is a real OTLP endpoint."""
    with OtlpGrpcReceiver() as rx:
        exporter = GrpcSpanExporter(endpoint=rx.url, insecure=True, timeout=5)
        try:
            assert exporter.export(SPANS) is SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        assert sorted(rx.span_ids()) == SPAN_IDS


def test_grpc_failure_queue_then_success() -> None:
    """Queued codes answer the next calls in order (None accepts one); then calls succeed."""
    codes = [grpc.StatusCode.UNAVAILABLE, None, grpc.StatusCode.INVALID_ARGUMENT]
    with OtlpGrpcReceiver(fail_with=codes) as rx:
        seen = []
        for _ in range(4):
            try:
                grpc_export(rx)
                seen.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                seen.append(exc.code())
        assert seen == [
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.OK,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.OK,
        ]
        assert len(rx.requests) == 2
        assert rx.failed_calls == 2


def test_grpc_always_fail_until_cleared() -> None:
    """always_fail answers every call until fail_always(None)."""
    with OtlpGrpcReceiver(always_fail=grpc.StatusCode.UNAVAILABLE) as rx:
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as info:
                grpc_export(rx)
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        rx.fail_always(None)
        grpc_export(rx)
        assert rx.span_count() == len(SPANS)
        assert rx.failed_calls == 3


def test_grpc_message_limit_rejects_large_requests() -> None:
    """Above max_receive_message_length gRPC answers RESOURCE_EXHAUSTED and nothing is stored."""
    big = encode_spans(synthetic_spans(400))
    assert big.ByteSize() > 64 * 1024
    with OtlpGrpcReceiver(max_receive_message_length=64 * 1024) as rx:
        with pytest.raises(grpc.RpcError) as info:
            grpc_export(rx, big)
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        grpc_export(rx)  # a small one still passes
        assert rx.requests == [REQUEST]


def test_clear_forgets_requests() -> None:
    """clear() empties the store so one receiver can serve several phases of a test."""
    with OtlpGrpcReceiver() as rx:
        grpc_export(rx)
        rx.clear()
        assert rx.requests == [] and rx.span_count() == 0


# --- HTTP -------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_http_receiver_accepts_protobuf(encoding: str | None) -> None:
    """POST /v1/traces with application/x-protobuf, optionally gzip-compressed."""
    body = REQUEST.SerializeToString()
    with OtlpHttpReceiver() as rx:
        assert rx.url == f"http://127.0.0.1:{rx.port}/v1/traces"
        wire = gzip.compress(body) if encoding else body
        assert http_post(rx.url, wire, "application/x-protobuf", encoding) == 200
        assert rx.requests == [REQUEST]
        assert rx.request_sizes == [len(body)]


def test_http_receiver_accepts_otlp_json_with_hex_ids() -> None:
    """application/json bodies use hex ids, as the OTLP/JSON format requires."""
    body = json.dumps(request_to_json(REQUEST)).encode()
    assert TRACE_ID.encode() in body
    with OtlpHttpReceiver() as rx:
        assert http_post(rx.url, body, "application/json; charset=utf-8") == 200
        assert rx.requests == [REQUEST]


def test_http_receiver_accepts_the_sdk_exporter() -> None:
    """The SDK's own OTLP/HTTP exporter delivers to it."""
    with OtlpHttpReceiver() as rx:
        exporter = HttpSpanExporter(endpoint=rx.url, timeout=5)
        try:
            assert exporter.export(SPANS) is SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        assert sorted(rx.span_ids()) == SPAN_IDS


def test_http_status_injection_and_body_limit() -> None:
    """Queued HTTP codes come first; bodies over max_body_bytes get 413."""
    body = REQUEST.SerializeToString()
    with OtlpHttpReceiver(fail_with=[503, 400], max_body_bytes=len(body)) as rx:
        assert [http_post(rx.url, body, "application/x-protobuf") for _ in range(3)] == [503, 400, 200]
        assert http_post(rx.url, body + b"\x00" * 10, "application/x-protobuf") == 413
        rx.fail_always(429)
        assert http_post(rx.url, body, "application/x-protobuf") == 429
        assert len(rx.requests) == 1
        assert rx.failed_calls == 4


def test_http_rejects_bad_requests() -> None:
    """Wrong path, unknown content type and garbage bodies are refused like a collector would."""
    with OtlpHttpReceiver() as rx:
        base = f"http://{rx.endpoint}"
        assert http_post(base + "/v1/metrics", b"", "application/x-protobuf") == 404
        assert http_post(rx.url, b"x", "text/plain") == 415
        assert http_post(rx.url, b"\xff\xff\xff", "application/x-protobuf") == 400
        assert http_post(rx.url, b"{not json", "application/json") == 400
        assert http_post(rx.url, b"not gzip", "application/x-protobuf", "gzip") == 400
        assert rx.requests == []


# --- helpers ----------------------------------------------------------------------------


def test_unused_port_refuses_connections() -> None:
    """unused_tcp_port() is a collector that is down: connecting is refused."""
    port = unused_tcp_port()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/traces", timeout=2)


def test_wait_for() -> None:
    """wait_for returns True as soon as the predicate holds, False after the timeout."""
    assert wait_for(lambda: True, timeout=0.01)
    assert not wait_for(lambda: False, timeout=0.05)


def test_synthetic_spans_are_deterministic_and_nonzero() -> None:
    """Same arguments, same ids; links and parents carry real ids."""
    a, b = synthetic_spans(8), synthetic_spans(8)
    assert [s.context.span_id for s in a] == [s.context.span_id for s in b]
    assert all(s.context.span_id and s.parent and s.links[0].context.span_id for s in a)
    assert len({s.context.span_id for s in a}) == 8
