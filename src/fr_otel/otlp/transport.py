"""What a transport answers for one request, in words the delivery loop acts on.

The gRPC and OTLP/HTTP senders (:mod:`fr_otel.otlp.grpc_sender`,
:mod:`fr_otel.otlp.http_sender`) map their status codes onto one :class:`SendResult`, so
retrying, re-packing and giving up are decided once (:mod:`fr_otel.otlp.send_loop`).
This module loads neither grpc nor the SDK: error hints may read :data:`NOT_GRPC` and
:data:`NOT_HTTP` without them.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Protocol

from ..common.text import one_line

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

__all__ = ["NOT_GRPC", "NOT_HTTP", "USER_AGENT", "Reply", "SendResult", "Sender", "partial_success"]

#: How an export error starts when the endpoint speaks another protocol (matched by the hints).
NOT_GRPC = "the endpoint does not speak gRPC"
NOT_HTTP = "the endpoint does not speak HTTP/1.1"
USER_AGENT = "fr-otel"


class SendResult(enum.Enum):
    """What one attempt came to, as what to do next (named apart from the analysis's
    :class:`fr_otel.diagnosis.verdict.Verdict`, which is about the job, not a request)."""

    OK = "ok"
    RETRY = "retry"  # transient: try again after a backoff
    SPLIT = "split"  # too large for the server: re-pack smaller
    REJECTED = "rejected"  # permanent for this chunk; others may pass
    FATAL = "fatal"  # permanent for the endpoint (auth, TLS, not found): stop


@dataclasses.dataclass(frozen=True)
class Reply:
    """The collector's answer to one request, as a :class:`SendResult` and one line of detail."""

    result: SendResult
    detail: str = ""
    retry_after_s: float | None = None
    rejected: int = 0  # OK with partial success: spans the collector accepted the request but dropped


class Sender(Protocol):
    """One connection to a collector; ``send`` never outlives ``timeout_s`` and never raises for the network."""

    def send(self, request: ExportTraceServiceRequest | bytes, timeout_s: float) -> Reply: ...

    def close(self) -> None: ...


def partial_success(rejected: object, message: object) -> Reply:
    """OTLP partial success: the request went through, but the collector says it dropped some spans."""
    try:
        count = max(int(rejected), 0) if isinstance(rejected, (int, float, str)) else 0
    except (TypeError, ValueError):
        count = 0
    if count:
        return Reply(SendResult.OK, one_line(str(message), 200), rejected=count)
    return Reply(SendResult.OK)
