"""Deliver spans over OTLP within a hard deadline, spooling to disk whatever did not make it.

fr-otel exports at the worst moment: a job is hung or being killed. The SDK's exporters
retry inside their own timeout and ``BatchSpanProcessor.force_flush`` reports success
even when every export failed, so this module sends the protobufs itself:

1. encode ``ReadableSpan``s straight to protobuf bytes and cut them into chunks under
   ``ExportConfig.max_request_bytes`` (:mod:`fr_otel.otlp.chunks`);
2. send each chunk with gRPC or HTTP (:mod:`fr_otel.otlp.grpc_sender`,
   :mod:`fr_otel.otlp.http_sender`), retrying transient failures and re-packing what
   the server finds too large, every attempt capped by the time left
   (:mod:`fr_otel.otlp.send_loop`);
3. write every chunk that failed, was rejected or was never attempted to an OTLP JSON
   Lines spool file (:mod:`fr_otel.otlp.jsonl`) for :func:`replay`, which delivers each
   spooled span exactly once across calls.

``deadline_s`` covers all of it, spool writing included. Only when the CPU work alone exceeds the budget
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

import dataclasses
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from ..common.log import logger
from ..common.text import one_line
from .chunks import Chunk, SpansOrRequests, encoded_chunks, repack
from .config import DEFAULT_MAX_REQUEST_BYTES, ExportConfig
from .jsonl import read_jsonl, write_jsonl
from .send_loop import (
    DEFAULT_MAX_ATTEMPTS,
    RENDER_VS_ENCODE,
    DeliveryBudget,
    deliver,
    open_sender,
)
from .transport import Sender

__all__ = ["DEFAULT_MAX_ATTEMPTS", "ExportResult", "export_spans", "replay", "write_embedded"]

_logger = logger("fr_otel")


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
    endpoint = config.shown_target()  # for lines and logs only: query values masked
    if config.disabled:
        return ExportResult(endpoint=endpoint, error="export disabled (OTEL_SDK_DISABLED=true)")
    state = DeliveryBudget.start(config, start, deadline_s, max_attempts)
    chunks, speedup = encoded_chunks(spans_or_requests, config.max_request_bytes, encoding)
    state.calibrate(sum(c.size for c in chunks), time.monotonic() - start, RENDER_VS_ENCODE * speedup)
    state.progress, state.spans_total = progress, sum(c.n_spans for c in chunks)
    sender = _open_sender(config, state)
    delivered: list[Chunk] = []
    undelivered = list(chunks)
    if sender is not None:
        try:
            delivered, undelivered = deliver(chunks, sender, state, spool_after=spool_dir is not None)
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
    return _finish("export", state, extra, endpoint, start, spans_sent=sum(c.accepted for c in delivered),
                   spans_spooled=n_undelivered - lost, spans_lost=lost, spool_path=spool_path)


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
    endpoint = config.shown_target()  # for lines and logs only: query values masked
    if config.disabled:
        return ExportResult(endpoint=endpoint, error="replay disabled (OTEL_SDK_DISABLED=true)")
    state = DeliveryBudget.start(config, start, deadline_s, max_attempts)
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
    sender = _open_sender(config, state)
    try:
        for path, requests in files:
            chunks = repack(requests, state.max_bytes)
            delivered: list[Chunk] = []
            undelivered = list(chunks)
            if sender is not None:
                delivered, undelivered = deliver(chunks, sender, state, spool_after=remove_on_success)
            sent += sum(c.accepted for c in delivered)
            spooled += sum(c.n_spans for c in undelivered)
            if not undelivered:
                completed.append(path)
            if remove_on_success and (delivered or not undelivered):
                try:
                    if undelivered:
                        write_jsonl(path, [c.spoolable for c in undelivered], replace=True, follow_links=True)
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
    return _finish("replay", state, extra, endpoint, start, spans_sent=sent, spans_spooled=spooled,
                   completed_paths=tuple(completed))


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
    chunks, _ = encoded_chunks(spans_or_requests, max_request_bytes, encoding)
    return write_jsonl(Path(out_dir) / filename, [c.request for c in chunks], replace=True)


def _open_sender(config: ExportConfig, state: DeliveryBudget) -> Sender | None:
    """The collector's sender, or None with the reason on ``state`` (unreadable certificate
    file, bad TLS material): nothing is sent then and every span stays undelivered."""
    try:
        return open_sender(config)
    except Exception as exc:  # noqa: BLE001 - any set-up failure is an export failure, never a crash
        state.stopped = one_line(f"cannot set up {config.protocol} exporter: {type(exc).__name__}: {exc}")
        return None


def _finish(what: str, state: DeliveryBudget, extra: list[str], endpoint: str, start: float,
            **counts: Any) -> ExportResult:
    """The result of an export or a replay (what the budget counted plus ``counts``), logged once."""
    result = ExportResult(requests_sent=state.requests_sent, spans_rejected=state.rejected_spans,
                          error=state.summary(extra), endpoint=endpoint, elapsed_s=time.monotonic() - start,
                          **counts)
    _log(what, result, state.notes)
    return result


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
