"""Send chunks in order within a deadline: retry with backoff, re-pack when too large, give up in time.

One export or replay call shares one :class:`DeliveryBudget` across its :func:`deliver`
calls: the deadline, the attempts allowed, the request size limit (lowered when the
server says a request is too large) and the running totals. When what is left will be
spooled, the network phase stops early enough to render it as JSON (rendered ahead
while backing off, at a speed re-measured on this machine).
"""

from __future__ import annotations

import collections
import dataclasses
import random
import re
import time
from collections.abc import Callable, Sequence

from ..common.text import one_line
from .chunks import Chunk, repack
from .config import ExportConfig
from .grpc_sender import GrpcSender
from .http_sender import HttpSender
from .jsonl import to_jsonl_line
from .tls_files import check_tls_files
from .transport import Reply, Sender, SendResult

__all__ = ["DEFAULT_MAX_ATTEMPTS", "RENDER_VS_ENCODE", "DeliveryBudget", "deliver", "open_sender"]

#: Attempts per chunk against transient failures before giving up on the collector.
DEFAULT_MAX_ATTEMPTS = 5
#: Rendering JSON costs about this many times encoding the protobuf (measured 2-2.5x).
RENDER_VS_ENCODE = 3.0
_BACKOFF_START_S = 0.1
_BACKOFF_MAX_S = 2.0
_LAST_TRY_MIN_S = 0.2  # below this, one more attempt is not worth it
#: Assumed speed of turning requests into OTLP JSON (protobuf's json_format does 4-8 MB/s
#: of protobuf on an idle core). The network phase stops early enough to spool what is
#: left, setting aside at most half of the budget; the speed is re-measured as we go.
_SPOOL_BYTES_PER_S = 2_500_000
_SPOOL_FIXED_S = 0.05
_SERVER_LIMIT = re.compile(r"larger than max \((\d+) vs\. (\d+)\)")


def open_sender(config: ExportConfig) -> Sender:
    """The transport ``config.protocol`` names; raises on unreadable TLS files."""
    check_tls_files(config)
    return GrpcSender(config) if config.protocol == "grpc" else HttpSender(config)


@dataclasses.dataclass
class DeliveryBudget:
    """Budget and running totals of one export or replay call, shared by its :func:`deliver` calls."""

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

    @classmethod
    def start(cls, config: ExportConfig, start: float, deadline_s: float, max_attempts: int) -> DeliveryBudget:
        """The budget of a call that began at monotonic ``start``; raises on a bad deadline or attempt count."""
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be positive, got {deadline_s!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts!r}")
        return cls(
            deadline=start + deadline_s,
            budget_s=deadline_s,
            timeout_s=config.timeout_s,
            max_attempts=max_attempts,
            max_bytes=config.max_request_bytes,
        )

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

    def summary(self, extra: Sequence[str] = ()) -> str | None:
        """One line on what went wrong (then ``extra``), ``None`` when nothing did."""
        parts: list[str] = []
        if self.stopped:
            parts.append(self.stopped)
        if self.errors:
            more = len(self.errors) - 1
            parts.append(self.errors[0] + (f" (+{more} more requests with rejections)" if more else ""))
            if more and self.rejected_spans:
                parts.append(f"{self.rejected_spans} spans rejected in all")
        parts.extend(extra)
        return one_line("; ".join(parts), 1000) if parts else None


def deliver(
    chunks: Sequence[Chunk], sender: Sender, state: DeliveryBudget, *, spool_after: bool
) -> tuple[list[Chunk], list[Chunk]]:
    """Send ``chunks`` in order; return (delivered, undelivered) and update ``state``.

    Transient failures are retried with jittered backoff until ``state.max_attempts`` or
    the deadline; then (or on a fatal error) nothing more is attempted in this call. A
    "too large" answer lowers ``state.max_bytes`` to the server's limit (or halves it)
    and re-packs everything still queued. ``spool_after``: what is left will be written
    as JSON, so keep time for that before the deadline and render it while backing off.
    """
    delivered: list[Chunk] = []
    undelivered: list[Chunk] = []
    queue = collections.deque(chunks)

    def unrendered_bytes(current: Chunk) -> int:
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
                reply = sender.send(chunk.payload, min(state.timeout_s, remaining))
            except Exception as exc:  # bad metadata, unreadable certificate...: stop, keep the data
                reply = Reply(SendResult.FATAL, one_line(f"{type(exc).__name__}: {exc}"))
            if reply.result is SendResult.OK:
                delivered.append(chunk)
                state.delivered(chunk.n_spans)
                if reply.rejected:
                    n = min(reply.rejected, chunk.n_spans)
                    chunk.rejected = n
                    state.rejected_spans += n
                    why = f": {reply.detail}" if reply.detail else ""
                    state.errors.append(f"collector rejected {n} of {chunk.n_spans} spans{why}")
                elif reply.detail:
                    state.notes.append(reply.detail)
                break
            if reply.result is SendResult.SPLIT and chunk.n_spans > 1:
                state.max_bytes = _lowered_limit(chunk.size, reply.detail)
                rest = [chunk, *queue]
                queue = collections.deque(repack([c.request for c in rest], state.max_bytes))
                break
            if reply.result in (SendResult.SPLIT, SendResult.REJECTED):
                state.rejected_spans += chunk.n_spans
                state.errors.append(f"rejected: {reply.detail}")
                undelivered.append(chunk)
                break
            if reply.result is SendResult.FATAL:
                state.stopped = reply.detail
                undelivered.append(chunk)
                break
            attempt += 1
            delay = reply.retry_after_s
            if delay is None:
                delay = min(_BACKOFF_START_S * 2 ** (attempt - 1), _BACKOFF_MAX_S) * random.uniform(0.8, 1.2)
            left = state.time_left(unrendered_bytes(chunk))
            if delay >= left > _LAST_TRY_MIN_S:
                delay = left / 2  # shorten the wait so the budget still buys one more try
            if attempt >= state.max_attempts or delay >= left:
                why = f"{attempt} attempts" if attempt >= state.max_attempts else "deadline"
                state.stopped = f"{reply.detail} (gave up: {why})"
                undelivered.append(chunk)
                break
            _wait(time.monotonic() + delay, [chunk, *queue] if spool_after else [], state)
    return delivered, undelivered


def _wait(until: float, to_render: Sequence[Chunk], state: DeliveryBudget) -> None:
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
