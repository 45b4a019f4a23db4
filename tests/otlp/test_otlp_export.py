"""OTLP export: chunking, delivery within a deadline, spooling, replay and the OTLP JSON file format."""

from __future__ import annotations

import base64
import json
import logging
import socket
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from fr_otel.otlp.config import ExportConfig, resolve_export_config
from fr_otel.otlp.chunks import chunk_requests, to_requests
from fr_otel.otlp.export import ExportResult, export_spans, replay, write_embedded
from fr_otel.otlp.jsonl import read_jsonl, request_from_json, request_to_json, write_jsonl
from fr_otel.testing.otlp import OtlpGrpcReceiver, OtlpHttpReceiver
from fr_otel.common.ports import unused_tcp_port
from fr_otel.testing.spans import synthetic_spans
from support.stopwatch import Stopwatch

KIB = 1024
SPANS = synthetic_spans(200, ranks=4)
SPAN_IDS = Counter(format(s.context.span_id, "016x") for s in SPANS)
SLACK_S = 0.3  # on top of a deadline: what the code does after it (the spool write, closing the channel)



def grpc_config(endpoint: str, **kwargs: object) -> ExportConfig:
    return resolve_export_config(endpoint=endpoint, environ={}, **kwargs)  # type: ignore[arg-type]


def http_config(endpoint: str, **kwargs: object) -> ExportConfig:
    kwargs.setdefault("protocol", "http/protobuf")
    return resolve_export_config(endpoint=endpoint, environ={}, **kwargs)  # type: ignore[arg-type]


def dead_endpoint(protocol: str) -> str:
    port = unused_tcp_port()
    return f"http://127.0.0.1:{port}" + ("" if protocol == "grpc" else "/v1/traces")


def all_spans(requests: list[ExportTraceServiceRequest]) -> list[bytes]:
    return [
        s.SerializeToString() for r in requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans
    ]


# --- delivery ---------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_grpc_delivery(tmp_path: Path, compression: str) -> None:
    """Every span reaches a gRPC receiver once, with its resource, ids and headers."""
    with OtlpGrpcReceiver() as rx:
        config = grpc_config(rx.url, compression=compression, headers={"X-Tenant": "ml"})
        result = export_spans(SPANS, config, deadline_s=5, spool_dir=tmp_path)
        assert result.ok and result.error is None
        assert (result.spans_sent, result.spans_spooled, result.spool_path) == (len(SPANS), 0, None)
        assert Counter(rx.span_ids()) == SPAN_IDS
        assert rx.requests == to_requests(SPANS)
        assert rx.received_headers[0]["x-tenant"] == "ml"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("protocol", "compression"), [("http/protobuf", "none"), ("http/protobuf", "gzip"), ("http/json", "gzip")]
)
def test_http_delivery(tmp_path: Path, protocol: str, compression: str) -> None:
    """OTLP/HTTP delivers the same requests as protobuf or OTLP/JSON, compressed or not."""
    with OtlpHttpReceiver() as rx:
        config = http_config(rx.url, protocol=protocol, compression=compression, headers="authorization=Bearer%20t")
        result = export_spans(SPANS, config, deadline_s=5, spool_dir=tmp_path)
        assert result.ok, result.error
        assert result.spans_sent == len(SPANS)
        assert rx.requests == to_requests(SPANS)
        assert rx.received_headers[0]["authorization"] == "Bearer t"
        expected_type = "application/json" if protocol == "http/json" else "application/x-protobuf"
        assert rx.received_headers[0]["content-type"] == expected_type


def test_grpc_endpoint_without_scheme_uses_insecure_flag(tmp_path: Path) -> None:
    """host:port plus insecure=True is plaintext gRPC (without the flag it would be TLS, as the spec says)."""
    with OtlpGrpcReceiver() as rx:
        assert export_spans(SPANS, grpc_config(rx.endpoint, insecure=True), deadline_s=5, spool_dir=tmp_path).ok
        tls = export_spans(SPANS, grpc_config(rx.endpoint), deadline_s=1, spool_dir=tmp_path, max_attempts=1)
        assert not tls.ok and tls.spans_spooled == len(SPANS)
        assert Counter(rx.span_ids()) == SPAN_IDS


def test_encoded_requests_are_sent_as_given(tmp_path: Path) -> None:
    """Already-encoded ExportTraceServiceRequests (one or a list) are accepted too."""
    request = encode_spans(SPANS[:10])
    with OtlpGrpcReceiver() as rx:
        assert export_spans(request, grpc_config(rx.url), deadline_s=5, spool_dir=tmp_path).spans_sent == 10
        assert (
            export_spans([request, *SPANS[10:20]], grpc_config(rx.url), deadline_s=5, spool_dir=tmp_path).spans_sent
            == 20
        )
        assert rx.requests[0] == request


def test_transient_failures_are_retried(tmp_path: Path) -> None:
    """UNAVAILABLE twice, then OK: everything is delivered once and nothing spooled."""
    with OtlpGrpcReceiver(fail_with=[grpc.StatusCode.UNAVAILABLE] * 2) as rx:
        result = export_spans(SPANS, grpc_config(rx.url), deadline_s=5, spool_dir=tmp_path)
        assert result.ok and result.spans_sent == len(SPANS)
        assert rx.failed_calls == 2
        assert Counter(rx.span_ids()) == SPAN_IDS


def test_http_retries_503_then_delivers(tmp_path: Path) -> None:
    """HTTP 503 and 429 are transient."""
    with OtlpHttpReceiver(fail_with=[503, 429]) as rx:
        result = export_spans(SPANS, http_config(rx.url), deadline_s=5, spool_dir=tmp_path)
        assert result.ok and Counter(rx.span_ids()) == SPAN_IDS


# --- chunking ---------------------------------------------------------------------------


def test_chunk_requests_respects_limit_order_and_grouping() -> None:
    """Chunks stay under the limit, keep span order and keep each span with its resource and scope."""
    spans = synthetic_spans(3000, ranks=8)
    request = encode_spans(spans)
    chunks = chunk_requests([request], 64 * KIB)
    assert len(chunks) == pytest.approx(request.ByteSize() / (64 * KIB), abs=3)
    assert max(c.ByteSize() for c in chunks) <= 64 * KIB
    assert all_spans(chunks) == all_spans([request])
    by_resource = {
        s.span_id: (rs.resource.SerializeToString(), ss.scope.name)
        for r in [request]
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    }
    for chunk in chunks:
        for rs in chunk.resource_spans:
            for ss in rs.scope_spans:
                assert all(by_resource[s.span_id] == (rs.resource.SerializeToString(), ss.scope.name) for s in ss.spans)


def test_chunk_keeps_an_oversized_span_alone() -> None:
    """A span larger than the limit cannot be split: it travels alone."""
    spans = synthetic_spans(3, attribute_bytes=5000)
    chunks = chunk_requests(to_requests(spans), 2 * KIB)
    assert len(chunks) == 3
    assert all_spans(chunks) == all_spans(to_requests(spans))


def test_chunked_grpc_export_under_a_small_message_limit(tmp_path: Path) -> None:
    """3000 spans through a 64 KiB gRPC receiver: many requests, none over the limit, each span once."""
    spans = synthetic_spans(3000, ranks=8)
    with OtlpGrpcReceiver(max_receive_message_length=64 * KIB) as rx:
        config = grpc_config(rx.url, max_request_bytes=64 * KIB)
        result = export_spans(spans, config, deadline_s=10, spool_dir=tmp_path)
        assert result.ok, result.error
        assert result.spans_sent == 3000 and result.requests_sent == len(rx.requests) > 10
        assert rx.failed_calls == 0
        assert max(rx.request_sizes) <= 64 * KIB
        assert Counter(rx.span_ids()) == Counter(format(s.context.span_id, "016x") for s in spans)


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_server_size_limit_is_learned(tmp_path: Path, transport: str) -> None:
    """With the default 3.5 MiB chunks, RESOURCE_EXHAUSTED / 413 shrink the chunks; each span arrives once."""
    spans = synthetic_spans(3000, ranks=8)
    receiver = (
        OtlpGrpcReceiver(max_receive_message_length=64 * KIB)
        if transport == "grpc"
        else OtlpHttpReceiver(max_body_bytes=64 * KIB)
    )
    with receiver as rx:
        config = grpc_config(rx.url) if transport == "grpc" else http_config(rx.url)
        result = export_spans(spans, config, deadline_s=10, spool_dir=tmp_path)
        assert result.ok, result.error
        assert max(rx.request_sizes) <= 64 * KIB
        assert Counter(rx.span_ids()) == Counter(format(s.context.span_id, "016x") for s in spans)


# --- failures, deadline, spool and replay -----------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_collector_down_is_bounded_spooled_and_replayable(tmp_path: Path, protocol: str) -> None:
    """A dead port: the export ends within its deadline, spools every span, and replay delivers each once.

    The span count is kept small so CPU work (encoding, JSON) stays negligible next to
    the deadline even on a loaded test machine; the chunking tests cover volume.
    """
    spans = synthetic_spans(400)
    config = resolve_export_config(
        protocol=protocol, endpoint=dead_endpoint(protocol), max_request_bytes=16 * KIB, environ={}
    )
    watch = Stopwatch()
    result = export_spans(spans, config, deadline_s=1.5, spool_dir=tmp_path / "spool", max_attempts=100)
    elapsed = watch.seconds()
    assert 0.5 <= elapsed <= 1.5 + SLACK_S  # kept retrying towards the deadline, no longer
    assert not result.ok and result.spans_sent == 0
    assert result.spans_spooled == 400 and result.spans_lost == 0
    assert result.spool_path is not None and result.spool_path.parent == tmp_path / "spool"
    assert result.error is not None and "\n" not in result.error
    assert len(read_jsonl(result.spool_path)) == len(chunk_requests(to_requests(spans), 16 * KIB)) > 1

    receiver = OtlpGrpcReceiver() if protocol == "grpc" else OtlpHttpReceiver()
    with receiver as rx:
        live = resolve_export_config(protocol=protocol, endpoint=rx.url, environ={})
        replayed = replay([result.spool_path], live, deadline_s=5, remove_on_success=True)
        assert replayed.ok, replayed.error
        assert replayed.spans_sent == 400 and replayed.completed_paths == (result.spool_path,)
        assert Counter(rx.span_ids()) == Counter(format(s.context.span_id, "016x") for s in spans)
    assert not result.spool_path.exists()


def test_unavailable_forever_is_bounded(tmp_path: Path) -> None:
    """A collector answering UNAVAILABLE forever cannot hold the export past its deadline."""
    with OtlpGrpcReceiver(always_fail=grpc.StatusCode.UNAVAILABLE) as rx:
        watch = Stopwatch()
        result = export_spans(SPANS, grpc_config(rx.url), deadline_s=1.0, spool_dir=tmp_path, max_attempts=1000)
        assert watch.seconds() <= 1.0 + SLACK_S
        assert rx.failed_calls >= 2 and rx.requests == []
        assert result.spans_spooled == len(SPANS) and "UNAVAILABLE" in (result.error or "")
        rx.fail_always(None)
        assert replay([result.spool_path], grpc_config(rx.url), deadline_s=5).spans_sent == len(SPANS)  # type: ignore[list-item]
        assert Counter(rx.span_ids()) == SPAN_IDS


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_collector_that_never_answers_is_bounded(tmp_path: Path, protocol: str) -> None:
    """A port that accepts connections but never answers cannot hold the export past its deadline."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # never accept(): the kernel completes handshakes, nobody replies
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}" + ("" if protocol == "grpc" else "/v1/traces")
        config = resolve_export_config(protocol=protocol, endpoint=endpoint, environ={})
        watch = Stopwatch()
        result = export_spans(SPANS, config, deadline_s=1.0, spool_dir=tmp_path)
        assert watch.seconds() <= 1.0 + SLACK_S
    assert result.spans_spooled == len(SPANS) and result.spans_sent == 0


def test_max_attempts_gives_up_early(tmp_path: Path) -> None:
    """With few attempts a dead collector costs well under the deadline."""
    started = time.monotonic()
    result = export_spans(SPANS, grpc_config(dead_endpoint("grpc")), deadline_s=30, spool_dir=tmp_path, max_attempts=2)
    assert time.monotonic() - started < 2.0
    assert result.spans_spooled == len(SPANS) and "gave up: 2 attempts" in (result.error or "")


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_permanent_rejection_is_spooled_and_reported(tmp_path: Path, transport: str) -> None:
    """INVALID_ARGUMENT / HTTP 400 is not retried: spooled (nothing lost) and reported as rejected."""
    receiver = (
        OtlpGrpcReceiver(always_fail=grpc.StatusCode.INVALID_ARGUMENT)
        if transport == "grpc"
        else OtlpHttpReceiver(always_fail=400)
    )
    with receiver as rx:
        config = (
            grpc_config(rx.url, max_request_bytes=8 * KIB)
            if transport == "grpc"
            else http_config(rx.url, max_request_bytes=8 * KIB)
        )
        started = time.monotonic()
        result = export_spans(SPANS, config, deadline_s=10, spool_dir=tmp_path)
        assert time.monotonic() - started < 2.0
        n_chunks = len(chunk_requests(to_requests(SPANS), 8 * KIB))
        assert rx.failed_calls == n_chunks > 1  # one call per chunk, no retries
        assert result.spans_rejected == result.spans_spooled == len(SPANS)
        assert (result.error or "").startswith("rejected:")
        rx.fail_always(None)
        assert replay([result.spool_path], config, deadline_s=5).ok  # type: ignore[list-item]
        assert Counter(rx.span_ids()) == SPAN_IDS


def test_fatal_status_stops_after_first_chunk(tmp_path: Path) -> None:
    """UNAUTHENTICATED will not fix itself: stop at once and spool everything."""
    with OtlpGrpcReceiver(always_fail=grpc.StatusCode.UNAUTHENTICATED) as rx:
        result = export_spans(SPANS, grpc_config(rx.url, max_request_bytes=8 * KIB), deadline_s=5, spool_dir=tmp_path)
        assert rx.failed_calls == 1
        assert result.spans_spooled == len(SPANS) and result.spans_rejected == 0
        assert "UNAUTHENTICATED" in (result.error or "")


def test_partial_replay_rewrites_the_file_then_finishes(tmp_path: Path) -> None:
    """A replay cut short keeps only the undelivered rest in the file; the next one delivers it: each span once."""
    path = write_embedded(SPANS, tmp_path, "incident", max_request_bytes=8 * KIB)
    n_lines = len(read_jsonl(path))
    assert n_lines > 3
    with OtlpGrpcReceiver(fail_with=[None, None, grpc.StatusCode.UNAVAILABLE]) as rx:
        config = grpc_config(rx.url, max_request_bytes=8 * KIB)
        first = replay([path], config, deadline_s=5, remove_on_success=True, max_attempts=1)
        assert not first.ok and first.spans_sent > 0 and first.spans_spooled > 0
        assert first.spans_sent + first.spans_spooled == len(SPANS)
        assert len(read_jsonl(path)) == n_lines - 2 and first.completed_paths == ()
        second = replay([path], config, deadline_s=5, remove_on_success=True)
        assert second.ok and second.spans_sent == first.spans_spooled
        assert Counter(rx.span_ids()) == SPAN_IDS
    assert not path.exists()


def test_replay_without_removal_leaves_files(tmp_path: Path) -> None:
    """Without remove_on_success the files stay and completed_paths names the delivered ones."""
    a = write_embedded(SPANS[:50], tmp_path, "a")
    b = write_embedded(SPANS[50:], tmp_path, "b.jsonl")
    with OtlpGrpcReceiver() as rx:
        result = replay([a, b], grpc_config(rx.url), deadline_s=5)
        assert result.ok and result.completed_paths == (a, b) and result.spans_sent == len(SPANS)
    assert a.exists() and b.exists()


def test_replay_skips_unreadable_files_and_names_them(tmp_path: Path) -> None:
    """A corrupt or missing file does not stop the others; error names file and line."""
    good = write_embedded(SPANS, tmp_path, "good")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"resourceSpans": []}\n{oops\n')
    with OtlpGrpcReceiver() as rx:
        result = replay([bad, tmp_path / "missing.jsonl", good], grpc_config(rx.url), deadline_s=5)
        assert result.spans_sent == len(SPANS) and result.completed_paths == (good,)
    assert not result.ok and f"{bad}:2" in (result.error or "") and "missing.jsonl" in (result.error or "")


def test_no_spool_dir_reports_lost_spans() -> None:
    """spool_dir=None: undelivered spans are counted as lost, not silently dropped."""
    result = export_spans(SPANS, grpc_config(dead_endpoint("grpc")), deadline_s=0.5, spool_dir=None)
    assert result.spans_lost == len(SPANS) and result.spans_spooled == 0 and result.spool_path is None
    assert "lost" in (result.error or "")


def test_named_spool_file(tmp_path: Path) -> None:
    """spool_name picks the file name, e.g. one per rank."""
    result = export_spans(
        SPANS, grpc_config(dead_endpoint("grpc")), deadline_s=0.5, spool_dir=tmp_path, spool_name="rank3.jsonl"
    )
    assert result.spool_path == tmp_path / "rank3.jsonl"


def test_disabled_sends_nothing(tmp_path: Path) -> None:
    """OTEL_SDK_DISABLED makes export a no-op that says so."""
    with OtlpGrpcReceiver() as rx:
        result = export_spans(SPANS, grpc_config(rx.url, disabled=True), deadline_s=5, spool_dir=tmp_path)
        assert rx.requests == [] and result.spans_sent == 0 and "OTEL_SDK_DISABLED" in (result.error or "")


def test_unreadable_certificate_spools_instead_of_raising(tmp_path: Path) -> None:
    """A TLS setup error is an export failure like any other: spooled, one line."""
    config = resolve_export_config(
        endpoint="https://127.0.0.1:1", certificate_file=str(tmp_path / "nope.pem"), environ={}
    )
    result = export_spans(SPANS, config, deadline_s=2, spool_dir=tmp_path)
    assert result.spans_spooled == len(SPANS) and "nope.pem" in (result.error or "")


def test_one_log_line_and_no_traceback(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A failed export logs exactly one warning on the fr_otel logger, without exception info."""
    caplog.set_level(logging.DEBUG, logger="fr_otel")
    export_spans(SPANS, grpc_config(dead_endpoint("grpc")), deadline_s=0.5, spool_dir=tmp_path)
    records = [r for r in caplog.records if r.name.startswith("fr_otel")]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING and records[0].exc_info is None
    assert "\n" not in records[0].getMessage()


def test_bad_deadline_is_a_programming_error(tmp_path: Path) -> None:
    """deadline_s must be positive (a caller bug, so it raises)."""
    with pytest.raises(ValueError, match="deadline_s"):
        export_spans(SPANS, grpc_config("127.0.0.1:1"), deadline_s=0, spool_dir=tmp_path)


def test_result_ok_means_no_error() -> None:
    """ExportResult.ok mirrors error is None."""
    assert ExportResult().ok and not ExportResult(error="x").ok


# --- OTLP JSON Lines files --------------------------------------------------------------


def test_jsonl_round_trip_with_hex_ids(tmp_path: Path) -> None:
    """Each line is OTLP/JSON with hex ids; read_jsonl gives back the very same requests."""
    requests = chunk_requests(to_requests(SPANS), 8 * KIB)
    path = write_jsonl(tmp_path / "out.jsonl", requests)
    lines = path.read_text().splitlines()
    assert len(lines) == len(requests)
    assert read_jsonl(path) == requests

    obj = json.loads(lines[0])
    span = obj["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    source = SPANS[0]
    assert span["traceId"] == format(source.context.trace_id, "032x")
    assert span["spanId"] == format(source.context.span_id, "016x")
    assert span["parentSpanId"] == format(source.parent.span_id, "016x")  # type: ignore[union-attr]
    assert span["links"][0]["spanId"] == format(source.links[0].context.span_id, "016x")
    assert span["startTimeUnixNano"] == str(source.start_time)  # 64-bit ints as strings
    assert span["kind"] == 1  # enums as integers
    assert "resourceSpans" in obj and "resource_spans" not in obj  # lowerCamelCase

    # protobuf's own JSON parser reads it once ids are back in base64
    for key in ("traceId", "spanId", "parentSpanId"):
        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    for link in span["links"]:
        for key in ("traceId", "spanId"):
            link[key] = base64.b64encode(bytes.fromhex(link[key])).decode()
    parsed = json_format.ParseDict(obj, ExportTraceServiceRequest())
    assert parsed.resource_spans[0].scope_spans[0].spans[0] == requests[0].resource_spans[0].scope_spans[0].spans[0]


def test_write_jsonl_appends_and_replaces(tmp_path: Path) -> None:
    """Appending adds lines to an existing file; replace=True starts it over; no temp files remain."""
    path = tmp_path / "sub" / "f.jsonl"
    one, two = encode_spans(SPANS[:2]), encode_spans(SPANS[2:4])
    write_jsonl(path, [one])
    write_jsonl(path, [two])
    assert read_jsonl(path) == [one, two]
    write_jsonl(path, [two], replace=True)
    assert read_jsonl(path) == [two]
    assert [p.name for p in path.parent.iterdir()] == ["f.jsonl"]


def test_read_jsonl_names_file_and_line(tmp_path: Path) -> None:
    """A malformed line is a ValueError naming the file and the line number."""
    good = json.dumps(request_to_json(encode_spans(SPANS[:1])))
    for bad_line, reason in [
        ("{nope", "Expecting"),
        ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', "traceId"),
        ("[]", "JSON object"),
    ]:
        path = tmp_path / "bad.jsonl"
        path.write_text(f"{good}\n\n{bad_line}\n")
        with pytest.raises(ValueError, match=rf"bad\.jsonl:3: .*{reason}"):
            read_jsonl(path)


def test_request_from_json_rejects_wrong_id_length() -> None:
    """A span id must be 16 hex digits (8 bytes)."""
    obj = request_to_json(encode_spans(SPANS[:1]))
    obj["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "abcd"
    with pytest.raises(ValueError, match="spanId must be 16 hex digits"):
        request_from_json(obj)


def test_write_embedded_is_chunked_and_replaceable(tmp_path: Path) -> None:
    """The embedded default file has one request per line under the size limit and is rewritten, not appended."""
    path = write_embedded(SPANS, tmp_path, "trace", max_request_bytes=8 * KIB)
    assert path == tmp_path / "trace.jsonl"
    first = read_jsonl(path)
    assert len(first) > 1 and max(r.ByteSize() for r in first) <= 8 * KIB
    assert all_spans(first) == all_spans(to_requests(SPANS))
    write_embedded(SPANS, tmp_path, "trace", max_request_bytes=8 * KIB)
    assert read_jsonl(path) == first
