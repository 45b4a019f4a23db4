"""OTLP/gRPC transport: unary ``TraceService/Export`` calls whose deadline is gRPC's own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import (
    TraceServiceStub,
)

from .config import ExportConfig
from .transport import NOT_GRPC, USER_AGENT, Reply, SendResult, partial_success

__all__ = ["GrpcSender"]

_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
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


class GrpcSender:
    """Unary ``TraceService/Export`` calls on one channel; the deadline is gRPC's own."""

    def __init__(self, config: ExportConfig) -> None:
        target = config.target()
        if "://" in target:
            parts = urlsplit(target)
            address, secure = parts.netloc, parts.scheme == "https"
        else:
            address, secure = target, not config.insecure
        options = [("grpc.enable_retries", 0), ("grpc.primary_user_agent", USER_AGENT)]
        if secure:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(config.certificate_file),
                private_key=_read(config.client_key_file),
                certificate_chain=_read(config.client_certificate_file),
            )
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = TraceServiceStub(self._channel)  # type: ignore[no-untyped-call]  # generated, no stubs
        # The same RPC for requests already serialized (no parse and re-serialise).
        self._export_bytes: grpc.UnaryUnaryMultiCallable[Any, ExportTraceServiceResponse] = self._channel.unary_unary(
            _EXPORT_METHOD, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString
        )
        self._metadata = tuple(config.headers.items())
        self._compression = grpc.Compression.Gzip if config.compression == "gzip" else None

    def send(self, request: ExportTraceServiceRequest | bytes, timeout_s: float) -> Reply:
        call = self._export_bytes if isinstance(request, bytes) else self._stub.Export
        try:
            response = call(request, timeout=timeout_s, metadata=self._metadata, compression=self._compression)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = (exc.details() if hasattr(exc, "details") else None) or ""
            detail = f"gRPC {code.name}: {details}".rstrip(": ")
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                if "larger than" in details or "too large" in details.lower():
                    return Reply(SendResult.SPLIT, detail)
                return Reply(SendResult.RETRY, detail, _grpc_retry_after(exc))
            if _TLS_HANDSHAKE.search(details):  # TLS against plaintext (or a bad certificate): no retry mends it
                return Reply(SendResult.FATAL, detail)
            if _NOT_HTTP2.search(details):  # an HTTP/1.1 server (an OTLP/HTTP port): no retry mends it
                return Reply(SendResult.FATAL, f"{NOT_GRPC}: {detail}")
            if code in _GRPC_RETRYABLE:
                return Reply(SendResult.RETRY, detail, _grpc_retry_after(exc))
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                return Reply(SendResult.REJECTED, detail)
            return Reply(SendResult.FATAL, detail)
        return partial_success(response.partial_success.rejected_spans, response.partial_success.error_message)

    def close(self) -> None:
        self._channel.close()


def _grpc_retry_after(exc: grpc.RpcError) -> float | None:
    """Server-requested delay from ``google.rpc.RetryInfo`` in the trailers, if any."""
    try:
        from google.rpc.error_details_pb2 import RetryInfo

        raw = None
        for item in exc.trailing_metadata() or ():  # the last of a repeated key, as a dict keeps
            if item.key == "google.rpc.retryinfo-bin":
                raw = item.value
        if raw is None:
            return None
        delay = RetryInfo.FromString(raw).retry_delay
        return float(delay.seconds + delay.nanos / 1e9)
    except Exception:  # malformed trailers only cost us the hint
        return None


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None
