"""Real OTLP trace receivers on loopback, for fr-otel's tests and for testing your setup.

Both receivers speak the real protocol (the official gRPC stubs; OTLP/HTTP on a stdlib
server), bind ``127.0.0.1:0`` and keep every accepted ``ExportTraceServiceRequest``.
Failure injection answers queued status codes before succeeding (or always fails), and
``reject_fraction`` answers OTLP partial success (that share of each request's spans
rejected), so retry, refusal, partial-success and spooling paths can be tested without
a collector::

    with OtlpGrpcReceiver(fail_with=[grpc.StatusCode.UNAVAILABLE]) as rx:
        config = resolve_export_config(endpoint=rx.url)
        export_spans(synthetic_spans(1000), config, deadline_s=5, spool_dir=tmp)  # testing.spans
        assert len(set(rx.span_ids())) == 1000

An unbound port (:func:`fr_otel.common.ports.unused_tcp_port`) stands in for a collector that is down.
"""

from __future__ import annotations

import collections
import gzip
import http.server
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from typing import Any, Generic, NamedTuple, TypeVar

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from ..otlp.jsonl import request_from_json

__all__ = [
    "OtlpGrpcReceiver",
    "OtlpHttpReceiver",
    "ReceivedSpan",
    "wait_for",
]

_Code = TypeVar("_Code")


class ReceivedSpan(NamedTuple):
    """One received span with the resource and scope it was grouped under."""

    resource: Resource
    scope: InstrumentationScope
    span: Span

    @property
    def resource_attributes(self) -> dict[str, Any]:
        """Resource attributes as plain Python values (string, int, float, bool, ...)."""
        return {kv.key: _any_value(kv.value) for kv in self.resource.attributes}

    @property
    def attributes(self) -> dict[str, Any]:
        """Span attributes as plain Python values."""
        return {kv.key: _any_value(kv.value) for kv in self.span.attributes}


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(interval)


class _Receiver(Generic[_Code]):
    """Storage, failure plan and query helpers shared by both transports."""

    def __init__(self, fail_with: Iterable[_Code | None] = (), always_fail: _Code | None = None,
                 reject_fraction: float = 0.0) -> None:
        self._lock = threading.Lock()
        #: Share of each request's spans answered as rejected (OTLP partial success) and not kept.
        self.reject_fraction = reject_fraction
        #: Spans answered as rejected, in all.
        self.rejected_spans = 0
        self._requests: list[ExportTraceServiceRequest] = []
        self._sizes: list[int] = []
        self._headers: list[dict[str, str]] = []
        self._failures: collections.deque[_Code | None] = collections.deque(fail_with)
        self._always: _Code | None = always_fail
        self.host = "127.0.0.1"
        self.port = 0
        #: Export calls answered with an injected or size failure.
        self.failed_calls = 0

    # -- failure injection ---------------------------------------------------------
    def fail_next(self, *codes: _Code | None) -> None:
        """Answer the next calls with these codes, in order; ``None`` accepts that call."""
        with self._lock:
            self._failures.extend(codes)

    def fail_always(self, code: _Code | None) -> None:
        """Answer every call with ``code`` (``None`` to stop)."""
        with self._lock:
            self._always = code

    def _next_failure(self) -> _Code | None:
        with self._lock:
            if self._always is not None:
                self.failed_calls += 1
                return self._always
            code = self._failures.popleft() if self._failures else None
            if code is not None:
                self.failed_calls += 1
            return code

    def _accept(self, request: ExportTraceServiceRequest, size: int,
                headers: dict[str, str]) -> ExportTraceServiceResponse:
        """Keep the request (minus the spans it rejects); the answer, partial success if any were."""
        rejected = self._reject_some(request)
        with self._lock:
            self._requests.append(request)
            self._sizes.append(size)
            self._headers.append(headers)
            self.rejected_spans += rejected
        response = ExportTraceServiceResponse()
        if rejected:
            response.partial_success.rejected_spans = rejected
            response.partial_success.error_message = f"test receiver rejected {rejected} spans"
        return response

    def _reject_some(self, request: ExportTraceServiceRequest) -> int:
        """Drop ``reject_fraction`` of the spans (rounded down, the last ones), like a collector's partial success."""
        total = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        to_drop = int(total * self.reject_fraction)
        left = to_drop
        for rs in reversed(request.resource_spans):
            for ss in reversed(rs.scope_spans):
                while left and len(ss.spans):
                    del ss.spans[-1]
                    left -= 1
        return to_drop

    # -- queries -------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """``HOST:PORT`` (``127.0.0.1:PORT`` unless bound elsewhere)."""
        return f"{self.host}:{self.port}"

    @property
    def requests(self) -> list[ExportTraceServiceRequest]:
        """Accepted requests, in arrival order (a copy of the list)."""
        with self._lock:
            return list(self._requests)

    @property
    def request_sizes(self) -> list[int]:
        """Serialized size in bytes of each accepted request, as received (before gzip)."""
        with self._lock:
            return list(self._sizes)

    @property
    def received_headers(self) -> list[dict[str, str]]:
        """Lower-cased headers / gRPC metadata of each accepted request."""
        with self._lock:
            return [dict(h) for h in self._headers]

    def spans(self) -> list[ReceivedSpan]:
        """Every accepted span with its resource and scope, in arrival order."""
        return [
            ReceivedSpan(rs.resource, ss.scope, span)
            for request in self.requests
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def span_count(self) -> int:
        """Number of accepted spans (duplicates counted)."""
        return len(self.spans())

    def span_ids(self) -> list[str]:
        """Hex span id of every accepted span, duplicates kept (to test exactly-once)."""
        return [r.span.span_id.hex() for r in self.spans()]

    def trace_ids(self) -> set[str]:
        """Distinct hex trace ids seen."""
        return {r.span.trace_id.hex() for r in self.spans()}

    def clear(self) -> None:
        """Forget accepted requests and counters (the failure plan is kept)."""
        with self._lock:
            self._requests.clear()
            self._sizes.clear()
            self._headers.clear()
            self.failed_calls = 0


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpGrpcReceiver) -> None:
        self._receiver = receiver

    def Export(  # noqa: N802 - name fixed by the generated stub
        self, request: ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> ExportTraceServiceResponse:
        code = self._receiver._next_failure()
        if code is not None:
            context.abort(code, f"injected failure: {code.name}")
        headers = {k.lower(): v for k, v in context.invocation_metadata() if isinstance(v, str)}
        return self._receiver._accept(request, request.ByteSize(), headers)


class OtlpGrpcReceiver(_Receiver[grpc.StatusCode]):
    """An OTLP/gRPC trace receiver on ``127.0.0.1:0``; use as a context manager.

    ``max_receive_message_length`` is the server's limit (gRPC answers
    RESOURCE_EXHAUSTED above it; collectors default to 4 MiB). ``fail_with`` is a queue
    of status codes for the next calls (``None`` accepts that call), after which calls
    succeed; ``always_fail`` answers every call. ``address`` (``host:port``) binds another
    loopback address or a fixed port, as a collector at a known address (``127.0.0.7:4317``).
    """

    def __init__(
        self,
        *,
        max_receive_message_length: int | None = None,
        fail_with: Sequence[grpc.StatusCode | None] = (),
        always_fail: grpc.StatusCode | None = None,
        max_workers: int = 4,
        reject_fraction: float = 0.0,
        address: str = "127.0.0.1:0",
    ) -> None:
        super().__init__(fail_with, always_fail, reject_fraction)
        options = [("grpc.so_reuseport", 0)]  # a taken address fails, never a port silently shared
        if max_receive_message_length is not None:
            options.append(("grpc.max_receive_message_length", int(max_receive_message_length)))
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=options)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]  # generated
            _TraceService(self), self._server
        )
        self.host = address.rpartition(":")[0]
        self.port = self._server.add_insecure_port(address)
        self._started = False

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: a gRPC endpoint that selects plaintext explicitly."""
        return f"http://{self.endpoint}"

    def start(self) -> OtlpGrpcReceiver:
        """Start serving (idempotent)."""
        if not self._started:
            self._server.start()
            self._started = True
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stop serving and wait until the server is down."""
        self._server.stop(grace).wait()
        self._started = False

    def __enter__(self) -> OtlpGrpcReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class OtlpHttpReceiver(_Receiver[int]):
    """An OTLP/HTTP trace receiver (``POST /v1/traces``) on ``127.0.0.1:0``.

    Accepts ``application/x-protobuf`` and ``application/json`` (OTLP/JSON, hex ids),
    optionally ``Content-Encoding: gzip``. Bodies over ``max_body_bytes`` get 413.
    ``fail_with`` / ``always_fail`` take HTTP status codes (e.g. 503, 400).
    """

    def __init__(
        self,
        *,
        max_body_bytes: int | None = None,
        fail_with: Sequence[int | None] = (),
        always_fail: int | None = None,
        reject_fraction: float = 0.0,
    ) -> None:
        super().__init__(fail_with, always_fail, reject_fraction)
        self.max_body_bytes = max_body_bytes
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The full traces URL, ``http://127.0.0.1:PORT/v1/traces``."""
        return f"http://{self.endpoint}/v1/traces"

    def start(self) -> OtlpHttpReceiver:
        """Start serving in a daemon thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> OtlpHttpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler_for(receiver: OtlpHttpReceiver) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != "/v1/traces":
                return self._reply(404, b"not found", close=True)
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                return self._reply(411, b"Content-Length required", close=True)
            limit = receiver.max_body_bytes
            if limit is not None and length > limit:
                with receiver._lock:
                    receiver.failed_calls += 1
                _drain(self.rfile, length)  # a client still sending would see a reset, not 413
                return self._reply(413, b"request body too large", close=True)
            body = self.rfile.read(length)
            code = receiver._next_failure()
            if code is not None:
                return self._reply(code, f"injected failure: {code}".encode())
            try:
                if self.headers.get("Content-Encoding", "").lower() == "gzip":
                    body = gzip.decompress(body)
                content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
                if content_type == "application/json":
                    request = request_from_json(json.loads(body))
                elif content_type == "application/x-protobuf":
                    request = ExportTraceServiceRequest.FromString(body)
                else:
                    return self._reply(415, b"unsupported content type")
            except Exception as exc:  # a test receiver answers 400, like a collector
                return self._reply(400, f"bad request: {exc}".encode())
            headers = {k.lower(): v for k, v in self.headers.items()}
            response = receiver._accept(request, len(body), headers)
            if content_type == "application/json":
                self._reply(200, json_format.MessageToJson(response).encode(), "application/json")
            else:
                self._reply(200, response.SerializeToString(), "application/x-protobuf")

        def _reply(self, status: int, body: bytes, ctype: str = "text/plain", close: bool = False) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

    return Handler


def _drain(stream: Any, length: int) -> None:
    while length > 0:
        chunk = stream.read(min(length, 1 << 16))
        if not chunk:
            return
        length -= len(chunk)


def _any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)
