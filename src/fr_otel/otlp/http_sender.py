"""OTLP/HTTP transport (protobuf or JSON): one POST per request, bounded by a daemon thread."""

from __future__ import annotations

import gzip
import http.client
import json
import ssl
import threading
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from ..common.text import one_line
from .config import ExportConfig
from .jsonl import request_to_json
from .transport import NOT_HTTP, USER_AGENT, Reply, SendResult, partial_success

__all__ = ["HttpSender"]

_HTTP_RETRYABLE = frozenset({429, 502, 503, 504})


class HttpSender:
    """One POST per chunk; runs in a daemon thread so a trickling server cannot outlast us."""

    def __init__(self, config: ExportConfig) -> None:
        self._url = config.target()
        self._json = config.protocol == "http/json"
        self._gzip = config.compression == "gzip"
        self._headers = {
            "Content-Type": "application/json" if self._json else "application/x-protobuf",
            "User-Agent": USER_AGENT,
            **dict(config.headers),
        }
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"
        self._context: ssl.SSLContext | None = None
        if urlsplit(self._url).scheme == "https":
            self._context = ssl.create_default_context(cafile=config.certificate_file)
            if config.client_certificate_file:
                self._context.load_cert_chain(config.client_certificate_file, config.client_key_file)

    def send(self, request: ExportTraceServiceRequest | bytes, timeout_s: float) -> Reply:
        if self._json:
            if isinstance(request, bytes):
                request = ExportTraceServiceRequest.FromString(request)
            body = json.dumps(request_to_json(request), separators=(",", ":")).encode()
        else:
            body = request if isinstance(request, bytes) else request.SerializeToString()
        if self._gzip:
            body = gzip.compress(body, compresslevel=6)
        box: list[Reply] = []

        def post() -> None:
            try:
                box.append(self._post(body, timeout_s))
            except Exception as exc:  # whatever the server sends back, never a thread traceback
                box.append(Reply(SendResult.RETRY, one_line(f"HTTP {type(exc).__name__}: {exc}")))

        worker = threading.Thread(target=post, daemon=True)
        worker.start()
        worker.join(timeout_s + 0.05)
        return box[0] if box else Reply(SendResult.RETRY, f"HTTP timed out after {timeout_s:.2f} s")

    def _post(self, body: bytes, timeout_s: float) -> Reply:
        req = urllib.request.Request(self._url, data=body, headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=self._context) as resp:
                payload = resp.read()
                ctype = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            text = one_line(exc.read(300).decode("utf-8", "replace")) if exc.fp else ""
            detail = f"HTTP {exc.code}: {text}".rstrip(": ")
            if exc.code == 413:
                return Reply(SendResult.SPLIT, detail)
            if exc.code in _HTTP_RETRYABLE:
                return Reply(SendResult.RETRY, detail, _retry_after_header(exc.headers.get("Retry-After")))
            if exc.code == 400:
                return Reply(SendResult.REJECTED, detail)
            return Reply(SendResult.FATAL, detail)
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLError):
                return Reply(SendResult.FATAL, f"TLS: {reason}")
            return Reply(SendResult.RETRY, f"HTTP connection failed: {reason}")
        except http.client.BadStatusLine as exc:
            if isinstance(exc, http.client.RemoteDisconnected):  # closed without answering: transient
                return Reply(SendResult.RETRY, f"HTTP connection failed: {exc}")
            return Reply(SendResult.FATAL, _not_http(exc.args[0] if exc.args else ""))  # its .line, untyped
        except (OSError, ValueError, http.client.HTTPException) as exc:  # timeouts, resets, malformed responses
            return Reply(SendResult.RETRY, one_line(f"HTTP {type(exc).__name__}: {exc}"))
        try:
            if "json" in ctype:
                partial = json.loads(payload or b"{}").get("partialSuccess") or {}
                return partial_success(partial.get("rejectedSpans", 0), partial.get("errorMessage", ""))
            ps = ExportTraceServiceResponse.FromString(payload).partial_success
            return partial_success(ps.rejected_spans, ps.error_message)
        except Exception:  # a 2xx with an unreadable body still means accepted
            return Reply(SendResult.OK)

    def close(self) -> None:
        pass


def _not_http(status_line: object) -> str:
    """What to say when the first line of the answer is no HTTP status line: HTTP/2 frames
    (a gRPC receiver greets with a SETTINGS frame) or some other protocol altogether."""
    line = str(status_line)
    if line[:1] == "\x00":  # an HTTP/2 frame header: 3 length bytes, the first 0 for any small frame
        return f"{NOT_HTTP}: it answered with HTTP/2 frames"
    return one_line(f"{NOT_HTTP}: it answered {line[:40]!r}")


def _retry_after_header(value: str | None) -> float | None:
    try:
        return max(float(value), 0.0) if value else None
    except ValueError:  # an HTTP date: not worth parsing under a deadline
        return None
