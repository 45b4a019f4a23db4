"""Requests cut to a collector's size limit: spans re-packed, resource and scope kept.

Collectors refuse gRPC messages over 4 MiB, so every request fr-otel sends or spools is
a chunk under ``ExportConfig.max_request_bytes``. Spans go through the direct encoder
(:mod:`fr_otel.otlp.encode`, ~10x the SDK's speed); encoded requests, or values the
direct encoder refuses, are encoded by the SDK and re-packed here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.sdk.trace import ReadableSpan

from .config import DEFAULT_MAX_REQUEST_BYTES
from .encode import Unencodable, encode_chunks

__all__ = [
    "DIRECT_SPEEDUP",
    "Chunk",
    "SpansOrRequests",
    "chunk_requests",
    "encoded_chunks",
    "repack",
    "to_requests",
]

SpansOrRequests = ExportTraceServiceRequest | Iterable[ReadableSpan | ExportTraceServiceRequest]

#: The direct encoder's speed over the SDK's (measured ~10x), for estimates based on encoding time.
DIRECT_SPEEDUP = 10.0
_WIDEST_FIELD = 1 + 5  # one-byte tag + a length varint for anything under 4 GiB


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
    return [c.request for c in repack(requests, max_bytes)]


@dataclasses.dataclass
class Chunk:
    """One request to send, in whichever form is at hand, and what became of its spans."""

    parsed: ExportTraceServiceRequest | None  # None: only ``data`` until someone needs the message
    n_spans: int
    line: bytes | None = None  # OTLP JSON line, rendered while waiting, for the spool
    data: bytes | None = None  # the serialized request, when encoded directly
    rejected: int = 0  # delivered, but the collector dropped this many (partial success)

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

    @property
    def accepted(self) -> int:
        return self.n_spans - self.rejected

    @property
    def spoolable(self) -> ExportTraceServiceRequest | bytes:
        return self.line if self.line is not None else self.request


def encoded_chunks(
    spans_or_requests: SpansOrRequests, max_bytes: int, progress: Callable[[int, int], None] | None = None
) -> tuple[list[Chunk], float]:
    """Chunks under ``max_bytes``, and how many times faster than the SDK they were encoded
    (spans go through the direct encoder, reporting ``progress``; requests, or values it
    refuses, the old way)."""
    if not isinstance(spans_or_requests, ExportTraceServiceRequest):
        items = list(spans_or_requests)
        if items and all(isinstance(item, ReadableSpan) for item in items):
            try:
                chunks = encode_chunks(items, max_bytes, progress)
                return [Chunk(None, c.n_spans, data=c.data) for c in chunks], DIRECT_SPEEDUP
            except Unencodable:
                pass
        spans_or_requests = items
    return repack(to_requests(spans_or_requests), max_bytes), 1.0


def repack(requests: Iterable[ExportTraceServiceRequest], max_bytes: int) -> list[Chunk]:
    """The spans of ``requests`` as chunks under ``max_bytes`` (see :func:`chunk_requests`)."""
    out: list[Chunk] = []
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
                        out.append(Chunk(cur, cur_n))
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
        out.append(Chunk(cur, cur_n))
    return out
