"""Deliver spans over OTLP within a hard deadline, spooling to disk whatever did not make it.

fr-otel exports at the worst moment: a job is hung or being killed. The SDK's exporters
retry inside their own timeout and ``BatchSpanProcessor.force_flush`` reports success
even when every export failed, so this module sends the protobufs itself:

1. encode ``ReadableSpan``s straight to protobuf bytes (:mod:`fr_otel.otlp.encode`, the
   SDK's ``encode_spans`` bytes ~10x sooner; the SDK itself for values it does not
   handle), or take encoded requests;
2. split them into chunks under ``ExportConfig.max_request_bytes`` (collectors refuse
   gRPC messages over 4 MiB), keeping the resource / scope grouping; if the server still
   finds a chunk too large (RESOURCE_EXHAUSTED, HTTP 413) the limit is lowered to the
   one it states (or halved) and everything still queued is re-packed;
3. send each chunk with gRPC or HTTP, retrying transient failures with jittered backoff
   (or the server's RetryInfo / Retry-After), every attempt capped by the time left;
4. write every chunk that failed, was rejected or was never attempted to an OTLP JSON
   Lines spool file (:mod:`fr_otel.otlp.jsonl`) for :func:`replay`.

``deadline_s`` covers all of it, spool writing included: the network phase stops early
enough to render what is left as JSON (rendered ahead while backing off, at a speed
re-measured on this machine). Only when the CPU work alone exceeds the budget
(tens of thousands of spans on a starved core) does the call run over.

Network failures never raise and never log a traceback: the :class:`ExportResult` says
what happened and one line goes to the ``fr_otel`` logger. Delivery is at least once: a
request that timed out after the collector accepted it is spooled and replayed again.

Usage::

    config = resolve_export_config()
    if config.endpoint is None:
        write_embedded(spans, out_dir, "trace")
    else:
        result = export_spans(spans, config, deadline_s=10, spool_dir=out_dir / "spool")
    ...
    replay(sorted(spool.glob("*.jsonl")), config, deadline_s=30, remove_on_success=True)
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import gzip
import http.client
import json
import logging
import os
import random
import re
import ssl
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import grpc
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import (
    TraceServiceStub,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.sdk.trace import ReadableSpan

from ..common.text import one_line
from .config import DEFAULT_MAX_REQUEST_BYTES, ExportConfig, check_tls_files
from .encode import Unencodable, encode_chunks
from .jsonl import read_jsonl, request_to_json, to_jsonl_line, write_jsonl

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "NOT_GRPC",
    "NOT_HTTP",
    "ExportResult",
    "SpansOrRequests",
    "chunk_requests",
    "export_spans",
    "replay",
    "to_requests",
    "write_embedded",
]

SpansOrRequests = ExportTraceServiceRequest | Iterable[ReadableSpan | ExportTraceServiceRequest]

#: Attempts per chunk against transient failures before giving up on the collector.
DEFAULT_MAX_ATTEMPTS = 5
_BACKOFF_START_S = 0.1
_BACKOFF_MAX_S = 2.0
_LAST_TRY_MIN_S = 0.2  # below this, one more attempt is not worth it
_USER_AGENT = "fr-otel"
_logger = logging.getLogger("fr_otel")


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What an export or replay did; ``ok`` when every span was delivered."""

    spans_sent: int = 0
    requests_sent: int = 0
    #: Spans written to ``spool_path`` (export) or still waiting in their files (replay).
    spans_spooled: int = 0
    #: Spans the collector refused for good: whole requests (INVALID_ARGUMENT, HTTP 400,
    #: a single span over its size limit; these are spooled, and replaying them as is will
    #: fail again) plus spans it dropped from requests it otherwise accepted (OTLP partial
    #: success: counted here, neither in ``spans_sent`` nor in the spool).
    spans_rejected: int = 0
    #: Spans neither delivered nor spooled (no spool directory, or it could not be written).
    spans_lost: int = 0
    spool_path: Path | None = None
    #: Replay only: input files whose every span was delivered in this call.
    completed_paths: tuple[Path, ...] = ()
    #: One line, ``None`` when everything was delivered.
    error: str | None = None
    endpoint: str = ""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when nothing is left to deliver."""
        return self.error is None


# --- Encoding and chunking --------------------------------------------------------------


def to_requests(spans_or_requests: SpansOrRequests) -> list[ExportTraceServiceRequest]:
    """Encoded requests as given, then one request encoding every ``ReadableSpan``."""
    if isinstance(spans_or_requests, ExportTraceServiceRequest):
        return [spans_or_requests]
    requests: list[ExportTraceServiceRequest] = []
    spans: list[ReadableSpan] = []
    for item in spans_or_requests:
        if isinstance(item, ExportTraceServiceRequest):
            requests.append(item)
        elif isinstance(item, ReadableSpan):
            spans.append(item)
        else:
            raise TypeError(f"expected ReadableSpan or ExportTraceServiceRequest, got {type(item).__name__}")
    if spans:
        requests.append(encode_spans(spans))
    return requests


def chunk_requests(
    requests: Iterable[ExportTraceServiceRequest], max_bytes: int = DEFAULT_MAX_REQUEST_BYTES
) -> list[ExportTraceServiceRequest]:
    """Re-pack spans into requests whose serialized size is at most ``max_bytes``.

    Spans keep their resource and scope (each chunk repeats the headers it needs) and
    their order. The size is counted conservatively (every length prefix at its widest),
    so no chunk exceeds the limit, except a single span that is larger on its own.
    Resource or scope blocks without spans carry nothing and are dropped.
    """
    return [c.request for c in _chunks(requests, max_bytes)]


_WIDEST_FIELD = 1 + 5  # one-byte tag + a length varint for anything under 4 GiB


@dataclasses.dataclass
class _Chunk:
    parsed: ExportTraceServiceRequest | None  # None: only ``data`` until someone needs the message
    n_spans: int
    line: bytes | None = None  # OTLP JSON line, rendered while waiting, for the spool
    data: bytes | None = None  # the serialized request, when encoded directly

    @property
    def request(self) -> ExportTraceServiceRequest:
        if self.parsed is None:
            assert self.data is not None
            self.parsed = ExportTraceServiceRequest.FromString(self.data)
        return self.parsed

    @property
    def payload(self) -> ExportTraceServiceRequest | bytes:
        """What a sender sends: the bytes when there are some (no second serialisation)."""
        return self.data if self.data is not None else self.request

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else self.request.ByteSize()
    rejected: int = 0  # delivered, but the collector dropped this many (partial success)

    @property
    def accepted(self) -> int:
        return self.n_spans - self.rejected

    @property
    def spoolable(self) -> ExportTraceServiceRequest | bytes:
        return self.line if self.line is not None else self.request


def _encoded_chunks(
    spans_or_requests: SpansOrRequests, max_bytes: int, progress: Callable[[int, int], None] | None = None
) -> tuple[list[_Chunk], float]:
    """Chunks under ``max_bytes``, and how many times faster than the SDK they were encoded
    (spans go through the direct encoder, reporting ``progress``; requests, or values it
    refuses, the old way)."""
    if not isinstance(spans_or_requests, ExportTraceServiceRequest):
        items = list(spans_or_requests)
        if items and all(isinstance(item, ReadableSpan) for item in items):
            try:
                chunks = encode_chunks(items, max_bytes, progress)
                return [_Chunk(None, c.n_spans, data=c.data) for c in chunks], _DIRECT_SPEEDUP
            except Unencodable:
                pass
        spans_or_requests = items
    return _chunks(to_requests(spans_or_requests), max_bytes), 1.0


def _chunks(requests: Iterable[ExportTraceServiceRequest], max_bytes: int) -> list[_Chunk]:
    out: list[_Chunk] = []
    cur = ExportTraceServiceRequest()
    cur_n = size = 0
    for request in requests:
        for rs in request.resource_spans:
            rs_head = ResourceSpans(resource=rs.resource, schema_url=rs.schema_url)
            rs_cost = _WIDEST_FIELD + rs_head.ByteSize()
            cur_rs: ResourceSpans | None = None
            for ss in rs.scope_spans:
                ss_head = ScopeSpans(scope=ss.scope, schema_url=ss.schema_url)
                ss_cost = _WIDEST_FIELD + ss_head.ByteSize()
                cur_ss: ScopeSpans | None = None
                for span in ss.spans:
                    cost = _WIDEST_FIELD + span.ByteSize()
                    extra = cost + (ss_cost if cur_ss is None else 0) + (rs_cost if cur_rs is None else 0)
                    if cur_n and size + extra > max_bytes:
                        out.append(_Chunk(cur, cur_n))
                        cur, cur_n, size, cur_rs, cur_ss = ExportTraceServiceRequest(), 0, 0, None, None
                    if cur_rs is None:
                        cur_rs = cur.resource_spans.add()
                        cur_rs.CopyFrom(rs_head)
                        size += rs_cost
                    if cur_ss is None:
                        cur_ss = cur_rs.scope_spans.add()
                        cur_ss.CopyFrom(ss_head)
                        size += ss_cost
                    cur_ss.spans.append(span)
                    size += cost
                    cur_n += 1
    if cur_n:
        out.append(_Chunk(cur, cur_n))
    return out


# --- Transports -------------------------------------------------------------------------


class _Verdict(enum.Enum):
    OK = "ok"
    RETRY = "retry"  # transient: try again after a backoff
    SPLIT = "split"  # too large for the server: re-pack smaller
    REJECTED = "rejected"  # permanent for this chunk; others may pass
    FATAL = "fatal"  # permanent for the endpoint (auth, TLS, not found): stop


@dataclasses.dataclass(frozen=True)
class _Outcome:
    verdict: _Verdict
    detail: str = ""
    retry_after_s: float | None = None
    rejected: int = 0  # OK with partial success: spans the collector accepted the request but dropped


class _Sender(Protocol):
    def send(self, request: ExportTraceServiceRequest | bytes, timeout_s: float) -> _Outcome: ...

    def close(self) -> None: ...


_GRPC_RETRYABLE = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


_TLS_HANDSHAKE = re.compile(r"handshake failed", re.IGNORECASE)
#: gRPC C-core's words for an answer that is not HTTP/2 (e.g. "Expected SETTINGS frame ... got frame type 72").
_NOT_HTTP2 = re.compile(r"Failed parsing HTTP/2|Expected SETTINGS frame", re.IGNORECASE)
#: How an export error starts when the endpoint speaks another protocol (matched by the hints).
NOT_GRPC = "the endpoint does not speak gRPC"
NOT_HTTP = "the endpoint does not speak HTTP/1.1"


class _GrpcSender:
    """Unary ``TraceService/Export`` calls on one channel; the deadline is gRPC's own."""

    def __init__(self, config: ExportConfig) -> None:
        target = config.target()
        if "://" in target:
            parts = urlsplit(target)
            address, secure = parts.netloc, parts.scheme == "https"
        else:
            address, secure = target, not config.insecure
        options = [("grpc.enable_retries", 0), ("grpc.primary_user_agent", _USER_AGENT)]
        if secure:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(config.certificate_file),
                private_key=_read(config.client_key_file),
                certificate_chain=_read(config.client_certificate_file),
            )
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = TraceServiceStub(self._channel)  # type: ignore[no-untyped-call]
        # The same RPC for requests already serialized (no parse and re-serialise).
        self._export_bytes = self._channel.unary_unary(
            _EXPORT_METHOD, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString
        )
        self._metadata = tuple(config.headers.items())
        self._compression = grpc.Compression.Gzip if config.compression == "gzip" else None

    def send(self, request: ExportTraceServiceRequest | bytes, timeout_s: float) -> _Outcome:
        call = self._export_bytes if isinstance(request, bytes) else self._stub.Export
        try:
            response = call(request, timeout=timeout_s, metadata=self._metadata, compression=self._compression)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = (exc.details() if hasattr(exc, "details") else None) or ""
            detail = f"gRPC {code.name}: {details}".rstrip(": ")
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                if "larger than" in details or "too large" in details.lower():
                    return _Outcome(_Verdict.SPLIT, detail)
                return _Outcome(_Verdict.RETRY, detail, _grpc_retry_after(exc))
            if _TLS_HANDSHAKE.search(details):  # TLS against plaintext (or a bad certificate): no retry mends it
                return _Outcome(_Verdict.FATAL, detail)
            if _NOT_HTTP2.search(details):  # an HTTP/1.1 server (an OTLP/HTTP port): no retry mends it
                return _Outcome(_Verdict.FATAL, f"{NOT_GRPC}: {detail}")
            if code in _GRPC_RETRYABLE:
                return _Outcome(_Verdict.RETRY, detail, _grpc_retry_after(exc))
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                return _Outcome(_Verdict.REJECTED, detail)
            return _Outcome(_Verdict.FATAL, detail)
        return _partial(response.partial_success.rejected_spans, response.partial_success.error_message)

    def close(self) -> None:
        self._channel.close()


def _grpc_retry_after(exc: grpc.RpcError) -> float | None:
    """Server-requested delay from ``google.rpc.RetryInfo`` in the trailers, if any."""
    try:
        from google.rpc.error_details_pb2 import RetryInfo

        raw = dict(exc.trailing_metadata() or ()).get("google.rpc.retryinfo-bin")
        if raw is None:
            return None
        delay = RetryInfo.FromString(raw).retry_delay
        return float(delay.seconds + delay.nanos / 1e9)
    except Exception:  # malformed trailers only cost us the hint
        return None


_HTTP_RETRYABLE = frozenset({429, 502, 503, 504})


class _HttpSender:
    """One POST per chunk; runs in a daemon thread so a trickling server cannot outlast us."""

    def __init__(self, config: ExportConfig) -> None:
        self._url = config.target()
        self._json = config.protocol == "http/json"
        self._gzip = config.compression == "gzip"
        self._headers = {
            "Content-Type": "application/json" if self._json else "application/x-protobuf",
            "User-Agent": _USER_AGENT,
            **dict(config.headers),
        }
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"
        self._context: ssl.SSLContext | None = None
        if urlsplit(self._url).scheme == "https":
            self._context = ssl.create_default_context(cafile=config.certificate_file)
            if config.client_certificate_file:
                self._context.load_cert_chain(config.client_certificate_file, config.client_key_file)

    def send(self, request: ExportTraceServiceRequest | bytes, timeout_s: float) -> _Outcome:
        if self._json:
            if isinstance(request, bytes):
                request = ExportTraceServiceRequest.FromString(request)
            body = json.dumps(request_to_json(request), separators=(",", ":")).encode()
        else:
            body = request if isinstance(request, bytes) else request.SerializeToString()
        if self._gzip:
            body = gzip.compress(body, compresslevel=6)
        box: list[_Outcome] = []

        def post() -> None:
            try:
                box.append(self._post(body, timeout_s))
            except Exception as exc:  # whatever the server sends back, never a thread traceback
                box.append(_Outcome(_Verdict.RETRY, one_line(f"HTTP {type(exc).__name__}: {exc}")))

        worker = threading.Thread(target=post, daemon=True)
        worker.start()
        worker.join(timeout_s + 0.05)
        return box[0] if box else _Outcome(_Verdict.RETRY, f"HTTP timed out after {timeout_s:.2f} s")

    def _post(self, body: bytes, timeout_s: float) -> _Outcome:
        req = urllib.request.Request(self._url, data=body, headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=self._context) as resp:
                payload = resp.read()
                ctype = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            text = one_line(exc.read(300).decode("utf-8", "replace")) if exc.fp else ""
            detail = f"HTTP {exc.code}: {text}".rstrip(": ")
            if exc.code == 413:
                return _Outcome(_Verdict.SPLIT, detail)
            if exc.code in _HTTP_RETRYABLE:
                return _Outcome(_Verdict.RETRY, detail, _retry_after_header(exc.headers.get("Retry-After")))
            if exc.code == 400:
                return _Outcome(_Verdict.REJECTED, detail)
            return _Outcome(_Verdict.FATAL, detail)
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLError):
                return _Outcome(_Verdict.FATAL, f"TLS: {reason}")
            return _Outcome(_Verdict.RETRY, f"HTTP connection failed: {reason}")
        except http.client.BadStatusLine as exc:
            if isinstance(exc, http.client.RemoteDisconnected):  # closed without answering: transient
                return _Outcome(_Verdict.RETRY, f"HTTP connection failed: {exc}")
            return _Outcome(_Verdict.FATAL, _not_http(exc.line))
        except (OSError, ValueError, http.client.HTTPException) as exc:  # timeouts, resets, malformed responses
            return _Outcome(_Verdict.RETRY, one_line(f"HTTP {type(exc).__name__}: {exc}"))
        try:
            if "json" in ctype:
                partial = json.loads(payload or b"{}").get("partialSuccess") or {}
                return _partial(partial.get("rejectedSpans", 0), partial.get("errorMessage", ""))
            ps = ExportTraceServiceResponse.FromString(payload).partial_success
            return _partial(ps.rejected_spans, ps.error_message)
        except Exception:  # a 2xx with an unreadable body still means accepted
            return _Outcome(_Verdict.OK)

    def close(self) -> None:
        pass


def _not_http(status_line: object) -> str:
    """What to say when the first line of the answer is no HTTP status line: HTTP/2 frames
    (a gRPC receiver greets with a SETTINGS frame) or some other protocol altogether."""
    line = str(status_line)
    if line[:1] == "\x00":  # an HTTP/2 frame header: 3 length bytes, the first 0 for any small frame
        return f"{NOT_HTTP}: it answered with HTTP/2 frames"
    return one_line(f"{NOT_HTTP}: it answered {line[:40]!r}")


def _partial(rejected: object, message: object) -> _Outcome:
    """OTLP partial success: the request went through, but the collector says it dropped some spans."""
    try:
        count = max(int(rejected), 0)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        count = 0
    if count:
        return _Outcome(_Verdict.OK, one_line(str(message), 200), rejected=count)
    return _Outcome(_Verdict.OK)


def _retry_after_header(value: str | None) -> float | None:
    try:
        return max(float(value), 0.0) if value else None
    except ValueError:  # an HTTP date: not worth parsing under a deadline
        return None


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def _make_sender(config: ExportConfig) -> _Sender:
    check_tls_files(config)
    return _GrpcSender(config) if config.protocol == "grpc" else _HttpSender(config)


# --- Delivery loop ----------------------------------------------------------------------

#: Assumed speed of turning requests into OTLP JSON (protobuf's json_format does 4-8 MB/s
#: of protobuf on an idle core). The network phase stops early enough to spool what is
#: left, setting aside at most half of the budget; the speed is re-measured as we go.
_SPOOL_BYTES_PER_S = 2_500_000
_SPOOL_FIXED_S = 0.05
#: Rendering JSON costs about this many times encoding the protobuf (measured 2-2.5x).
_RENDER_VS_ENCODE = 3.0
#: The direct encoder's speed over the SDK's (measured ~10x), so the estimate above still holds.
_DIRECT_SPEEDUP = 10.0
_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_SERVER_LIMIT = re.compile(r"larger than max \((\d+) vs\. (\d+)\)")


@dataclasses.dataclass
class _Delivery:
    """Budget and running totals of one export or replay call, shared by its ``_deliver`` calls."""

    deadline: float  # monotonic time by which the whole call must be done
    budget_s: float
    timeout_s: float
    max_attempts: int
    max_bytes: int  # lowered when the server says a request is too large
    render_bytes_per_s: float = _SPOOL_BYTES_PER_S  # lowered when this machine proves slower
    rejected_spans: int = 0
    requests_sent: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    stopped: str | None = None  # why nothing more will be attempted
    notes: list[str] = dataclasses.field(default_factory=list)
    progress: Callable[[int, int], None] | None = None  # (spans delivered, spans to send)
    spans_done: int = 0
    spans_total: int = 0

    def delivered(self, n_spans: int) -> None:
        self.requests_sent += 1
        self.spans_done += n_spans
        if self.progress is not None:
            self.progress(self.spans_done, self.spans_total)

    def calibrate(self, n_bytes: int, seconds: float, factor: float) -> None:
        """Lower the rendering speed estimate after ``factor * seconds`` of work on ``n_bytes``."""
        if seconds > 0.01 and n_bytes > 0:
            self.render_bytes_per_s = min(self.render_bytes_per_s, n_bytes / (factor * seconds))

    def time_left(self, bytes_to_write: int) -> float:
        """Seconds left for the network once writing ``bytes_to_write`` as JSON is set aside."""
        reserve = min(_SPOOL_FIXED_S + bytes_to_write / self.render_bytes_per_s, 0.5 * self.budget_s)
        return self.deadline - reserve - time.monotonic()


def _deliver(
    chunks: Sequence[_Chunk], sender: _Sender, state: _Delivery, *, spool_after: bool
) -> tuple[list[_Chunk], list[_Chunk]]:
    """Send ``chunks`` in order; return (delivered, undelivered) and update ``state``.

    Transient failures are retried with jittered backoff until ``state.max_attempts`` or
    the deadline; then (or on a fatal error) nothing more is attempted in this call. A
    "too large" answer lowers ``state.max_bytes`` to the server's limit (or halves it)
    and re-packs everything still queued. ``spool_after``: what is left will be written
    as JSON, so keep time for that before the deadline and render it while backing off.
    """
    delivered: list[_Chunk] = []
    undelivered: list[_Chunk] = []
    queue = collections.deque(chunks)

    def unrendered_bytes(current: _Chunk) -> int:
        if not spool_after:
            return 0
        return sum(c.size for c in (current, *queue, *undelivered) if c.line is None)

    while queue:
        chunk = queue.popleft()
        if state.stopped:
            undelivered.append(chunk)
            continue
        attempt = 0
        while True:
            remaining = state.time_left(unrendered_bytes(chunk))
            if remaining <= 0.001:
                state.stopped = state.stopped or "deadline reached"
                undelivered.append(chunk)
                break
            try:
                outcome = sender.send(chunk.payload, min(state.timeout_s, remaining))
            except Exception as exc:  # bad metadata, unreadable certificate...: stop, keep the data
                outcome = _Outcome(_Verdict.FATAL, one_line(f"{type(exc).__name__}: {exc}"))
            if outcome.verdict is _Verdict.OK:
                delivered.append(chunk)
                state.delivered(chunk.n_spans)
                if outcome.rejected:
                    n = min(outcome.rejected, chunk.n_spans)
                    chunk.rejected = n
                    state.rejected_spans += n
                    why = f": {outcome.detail}" if outcome.detail else ""
                    state.errors.append(f"collector rejected {n} of {chunk.n_spans} spans{why}")
                elif outcome.detail:
                    state.notes.append(outcome.detail)
                break
            if outcome.verdict is _Verdict.SPLIT and chunk.n_spans > 1:
                state.max_bytes = _lowered_limit(chunk.size, outcome.detail)
                rest = [chunk, *queue]
                queue = collections.deque(_chunks([c.request for c in rest], state.max_bytes))
                break
            if outcome.verdict in (_Verdict.SPLIT, _Verdict.REJECTED):
                state.rejected_spans += chunk.n_spans
                state.errors.append(f"rejected: {outcome.detail}")
                undelivered.append(chunk)
                break
            if outcome.verdict is _Verdict.FATAL:
                state.stopped = outcome.detail
                undelivered.append(chunk)
                break
            attempt += 1
            delay = outcome.retry_after_s
            if delay is None:
                delay = min(_BACKOFF_START_S * 2 ** (attempt - 1), _BACKOFF_MAX_S) * random.uniform(0.8, 1.2)
            left = state.time_left(unrendered_bytes(chunk))
            if delay >= left and left > _LAST_TRY_MIN_S:
                delay = left / 2  # shorten the wait so the budget still buys one more try
            if attempt >= state.max_attempts or delay >= left:
                why = f"{attempt} attempts" if attempt >= state.max_attempts else "deadline"
                state.stopped = f"{outcome.detail} (gave up: {why})"
                undelivered.append(chunk)
                break
            _wait(time.monotonic() + delay, [chunk, *queue] if spool_after else [], state)
    return delivered, undelivered


def _wait(until: float, to_render: Sequence[_Chunk], state: _Delivery) -> None:
    """Sleep until ``until``, first rendering spool lines: the wait costs nothing extra then."""
    for chunk in to_render:
        if time.monotonic() >= until:
            break
        if chunk.line is None:
            began = time.monotonic()
            chunk.line = to_jsonl_line(chunk.request)
            state.calibrate(chunk.size, time.monotonic() - began, 1.0)
    rest = until - time.monotonic()
    if rest > 0:
        time.sleep(rest)


def _lowered_limit(size: int, detail: str) -> int:
    """The server's limit when its message states it (gRPC does), else half the refused size."""
    match = _SERVER_LIMIT.search(detail)
    if match and int(match.group(2)) < size:
        return max(int(match.group(2)), 1)
    return max(size // 2, 1)


def _state(config: ExportConfig, start: float, deadline_s: float, max_attempts: int) -> _Delivery:
    if not deadline_s > 0:
        raise ValueError(f"deadline_s must be positive, got {deadline_s!r}")
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts!r}")
    return _Delivery(
        deadline=start + deadline_s,
        budget_s=deadline_s,
        timeout_s=config.timeout_s,
        max_attempts=max_attempts,
        max_bytes=config.max_request_bytes,
    )


def _summary(state: _Delivery, extra: Sequence[str] = ()) -> str | None:
    parts: list[str] = []
    if state.stopped:
        parts.append(state.stopped)
    if state.errors:
        more = len(state.errors) - 1
        parts.append(state.errors[0] + (f" (+{more} more requests with rejections)" if more else ""))
        if more and state.rejected_spans:
            parts.append(f"{state.rejected_spans} spans rejected in all")
    parts.extend(extra)
    return one_line("; ".join(parts), 1000) if parts else None


# --- Public entry points ----------------------------------------------------------------


def export_spans(
    spans_or_requests: SpansOrRequests,
    config: ExportConfig,
    *,
    deadline_s: float,
    spool_dir: str | os.PathLike[str] | None,
    spool_name: str | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    progress: Callable[[int, int], None] | None = None,
    encoding: Callable[[int, int], None] | None = None,
) -> ExportResult:
    """Send spans to ``config``'s collector, done within ``deadline_s``; spool the rest.

    ``config.endpoint is None`` dials the protocol's default (``localhost:4317`` /
    ``:4318``); callers that want the embedded file instead check it first.
    Undelivered chunks go to ``spool_dir/spool_name`` (default: a unique
    ``fr-otel-spool-*.jsonl``); with ``spool_dir=None`` they are reported as lost.
    ``config.disabled`` (``OTEL_SDK_DISABLED``) makes this a no-op. ``progress(spans
    delivered, spans)`` is called after each delivered request, ``encoding(spans encoded,
    spans)`` while they are encoded first.
    """
    start = time.monotonic()
    endpoint = config.target()
    if config.disabled:
        return ExportResult(endpoint=endpoint, error="export disabled (OTEL_SDK_DISABLED=true)")
    state = _state(config, start, deadline_s, max_attempts)
    chunks, speedup = _encoded_chunks(spans_or_requests, config.max_request_bytes, encoding)
    state.calibrate(sum(c.size for c in chunks), time.monotonic() - start, _RENDER_VS_ENCODE * speedup)
    state.progress, state.spans_total = progress, sum(c.n_spans for c in chunks)
    try:
        sender = _make_sender(config)
    except Exception as exc:  # unreadable certificate file, bad TLS material
        state.stopped = one_line(f"cannot set up {config.protocol} exporter: {type(exc).__name__}: {exc}")
        delivered: list[_Chunk] = []
        undelivered = list(chunks)
    else:
        try:
            delivered, undelivered = _deliver(chunks, sender, state, spool_after=spool_dir is not None)
        finally:
            sender.close()

    spool_path: Path | None = None
    lost = 0
    extra: list[str] = []
    n_undelivered = sum(c.n_spans for c in undelivered)
    if undelivered:
        if spool_dir is None:
            lost = n_undelivered
            extra.append(f"{lost} spans lost (no spool directory)")
        else:
            name = (
                spool_name
                or f"fr-otel-spool-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
            )
            try:
                spool_path = write_jsonl(Path(spool_dir) / name, [c.spoolable for c in undelivered])
            except OSError as exc:
                lost = n_undelivered
                extra.append(one_line(f"{lost} spans lost, spool failed: {exc}"))
    result = ExportResult(
        spans_sent=sum(c.accepted for c in delivered),
        requests_sent=state.requests_sent,
        spans_spooled=n_undelivered - lost,
        spans_rejected=state.rejected_spans,
        spans_lost=lost,
        spool_path=spool_path,
        error=_summary(state, extra),
        endpoint=endpoint,
        elapsed_s=time.monotonic() - start,
    )
    _log("export", result, state.notes)
    return result


def replay(
    paths: Iterable[str | os.PathLike[str]],
    config: ExportConfig,
    *,
    deadline_s: float,
    remove_on_success: bool = False,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    progress: Callable[[int, int], None] | None = None,
) -> ExportResult:
    """Send the requests stored in OTLP JSON Lines files (spools or embedded outputs).

    One call delivers each stored span at most once. With ``remove_on_success`` a fully
    delivered file is deleted and a partly delivered one is rewritten with only the
    rest, so calling ``replay`` again until ``ok`` delivers every span exactly once.
    Without it files are untouched and ``completed_paths`` lists the delivered ones.
    An unreadable file is skipped and named in ``error``. ``progress`` as in :func:`export_spans`.
    """
    start = time.monotonic()
    endpoint = config.target()
    if config.disabled:
        return ExportResult(endpoint=endpoint, error="replay disabled (OTEL_SDK_DISABLED=true)")
    state = _state(config, start, deadline_s, max_attempts)
    extra: list[str] = []
    files: list[tuple[Path, list[ExportTraceServiceRequest]]] = []
    for raw in paths:
        path = Path(raw)
        try:
            files.append((path, read_jsonl(path)))
        except (OSError, ValueError) as exc:
            extra.append(one_line(f"skipped {exc}" if isinstance(exc, ValueError) else f"skipped {path}: {exc}"))
    state.progress = progress
    state.spans_total = sum(len(ss.spans) for _, requests in files for r in requests for rs in r.resource_spans
                            for ss in rs.scope_spans)
    sent = spooled = 0
    completed: list[Path] = []
    try:
        sender = _make_sender(config)
    except Exception as exc:
        state.stopped = one_line(f"cannot set up {config.protocol} exporter: {type(exc).__name__}: {exc}")
        sender = None
    try:
        for path, requests in files:
            chunks = _chunks(requests, state.max_bytes)
            delivered: list[_Chunk] = []
            undelivered = list(chunks)
            if sender is not None:
                delivered, undelivered = _deliver(chunks, sender, state, spool_after=remove_on_success)
            sent += sum(c.accepted for c in delivered)
            spooled += sum(c.n_spans for c in undelivered)
            if not undelivered:
                completed.append(path)
            if remove_on_success and (delivered or not undelivered):
                try:
                    if undelivered:
                        write_jsonl(path, [c.spoolable for c in undelivered], replace=True)
                    else:
                        path.unlink(missing_ok=True)
                except OSError as exc:
                    # The file still holds what was just delivered: count it as still there (a
                    # later replay sends it again), rather than claim only the rest is left.
                    again = sum(c.n_spans for c in delivered)
                    spooled += again
                    if path in completed:
                        completed.remove(path)
                    extra.append(one_line(f"delivered but could not update {path} ({exc}); its {again} delivered "
                                          "spans are still in it and a later replay sends them again"))
    finally:
        if sender is not None:
            sender.close()
    result = ExportResult(
        spans_sent=sent,
        requests_sent=state.requests_sent,
        spans_spooled=spooled,
        spans_rejected=state.rejected_spans,
        completed_paths=tuple(completed),
        error=_summary(state, extra),
        endpoint=endpoint,
        elapsed_s=time.monotonic() - start,
    )
    _log("replay", result, state.notes)
    return result


def write_embedded(
    spans_or_requests: SpansOrRequests,
    out_dir: str | os.PathLike[str],
    name: str,
    *,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    encoding: Callable[[int, int], None] | None = None,
) -> Path:
    """Write spans as ``out_dir/name`` (``.jsonl`` added if missing), replacing any old file.

    Lines are chunked like network requests, so the file can be replayed or POSTed line
    by line to an OTLP/HTTP endpoint without hitting a collector's size limit.
    """
    filename = name if name.endswith(".jsonl") else f"{name}.jsonl"
    chunks, _ = _encoded_chunks(spans_or_requests, max_request_bytes, encoding)
    return write_jsonl(Path(out_dir) / filename, [c.request for c in chunks], replace=True)


def _log(what: str, result: ExportResult, notes: Sequence[str]) -> None:
    if result.error is None:
        _logger.info(
            "OTLP %s to %s: %d spans in %d requests, %.2f s%s",
            what,
            result.endpoint,
            result.spans_sent,
            result.requests_sent,
            result.elapsed_s,
            f" ({one_line(notes[0])})" if notes else "",
        )
        return
    where = f" to {result.spool_path}" if result.spool_path else ""
    _logger.warning(
        "OTLP %s to %s incomplete after %.2f s: %d spans sent, %d rejected, %d spooled%s, %d lost: %s",
        what,
        result.endpoint,
        result.elapsed_s,
        result.spans_sent,
        result.spans_rejected,
        result.spans_spooled,
        where,
        result.spans_lost,
        result.error,
    )
