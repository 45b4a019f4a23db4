"""The OTLP file format: JSON Lines of ``TracesData``, trace and span ids in hex.

Each line is one ``{"resourceSpans": [...]}`` object in the OTLP/JSON mapping:
lowerCamelCase keys, enums as integers, 64-bit integers as strings and, unlike
protobuf's default JSON mapping (base64), **trace and span ids as hex** (span
``traceId``/``spanId``/``parentSpanId`` and link ``traceId``/``spanId``). That is what
the OpenTelemetry collector's file exporter writes, what Jaeger UI's "JSON File"
upload reads, and what an OTLP/HTTP ``/v1/traces`` endpoint accepts as
``application/json`` line by line. fr-otel uses it for the embedded default output,
for the spool of exports that failed, and to replay both.

``ExportTraceServiceRequest`` has the same single field as ``TracesData``, so one
line is one request and :func:`read_jsonl` round-trips :func:`write_jsonl` exactly.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from ..common.files import OutputRefused, atomic_write, check_output_file

__all__ = [
    "read_jsonl",
    "request_from_json",
    "request_to_json",
    "to_jsonl_line",
    "write_jsonl",
]

_SPAN_ID_KEYS = {"traceId": 16, "spanId": 8, "parentSpanId": 8}
_LINK_ID_KEYS = {"traceId": 16, "spanId": 8}


def request_to_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP/JSON object for one request (ids as hex), ready for ``json.dumps``."""
    obj: dict[str, Any] = json_format.MessageToDict(request, use_integers_for_enums=True)
    _convert_ids(obj, _b64_to_hex)
    return obj


def request_from_json(obj: Any) -> ExportTraceServiceRequest:
    """Parse one OTLP/JSON object (hex ids); unknown fields are ignored, as OTLP requires."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object with 'resourceSpans', got {type(obj).__name__}")
    obj = json.loads(json.dumps(obj))  # private deep copy: ids are rewritten in place
    _convert_ids(obj, _hex_to_b64)
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(obj, request, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise ValueError(f"not OTLP/JSON traces: {exc}") from None
    return request


def to_jsonl_line(request: ExportTraceServiceRequest) -> bytes:
    """One request as a complete OTLP JSON Lines line (UTF-8, newline-terminated).

    Rendering is the slow part of writing (protobuf's ``json_format``); exporters
    render ahead of time, while they wait anyway, and hand the lines to ``write_jsonl``.
    """
    text = json.dumps(request_to_json(request), separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8") + b"\n"


def write_jsonl(
    path: str | os.PathLike[str],
    requests: Iterable[ExportTraceServiceRequest | bytes],
    *,
    replace: bool = False,
    follow_links: bool = False,
) -> Path:
    """Write one line per request; append to an existing file unless ``replace``.

    Items are requests or lines already rendered by :func:`to_jsonl_line`. A new (or
    replaced) file appears complete or not at all (temp file + link/rename), so a
    reader never sees half a file. Appends go out in one ``write`` on an ``O_APPEND``
    descriptor, which keeps concurrent writers' lines whole on local disks. A symbolic
    link at ``path`` is replaced, never appended through, unless ``follow_links`` (a file
    a person named: ``fr-otel replay FILE`` rewriting it).
    """
    target = Path(path)
    payload = b"".join(r if isinstance(r, bytes) else to_jsonl_line(r) for r in requests)
    if not replace and target.exists() and (follow_links or not target.is_symlink()):
        _append(target, payload, follow_links)
        return target
    try:
        return atomic_write(target, payload, replace=replace or target.is_symlink(), mkdir=True,
                            follow_links=follow_links)
    except FileExistsError:  # someone created it meanwhile: add our lines to theirs
        _append(target, payload, follow_links)
        return target


def read_jsonl(path: str | os.PathLike[str]) -> list[ExportTraceServiceRequest]:
    """Read every request of an OTLP JSON Lines file; blank lines are skipped.

    A malformed line raises ``ValueError("<file>:<line>: <why>")``.
    """
    source = Path(path)
    requests: list[ExportTraceServiceRequest] = []
    with source.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                requests.append(request_from_json(json.loads(line)))
            except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise ValueError(f"{source}:{lineno}: {reason}") from None
    return requests


def _append(target: Path, payload: bytes, follow_links: bool) -> None:
    check_output_file(target)
    nofollow = 0 if follow_links else getattr(os, "O_NOFOLLOW", 0)  # a link swapped in: ELOOP, not written through
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | nofollow, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a FIFO or device since the check
            raise OutputRefused(f"{target}: not a regular file; refusing to append to it")
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)


def _convert_ids(obj: dict[str, Any], convert: Any) -> None:
    """Rewrite every id field in place with ``convert(value, n_bytes, key)``."""
    for resource_spans in _list(obj, "resourceSpans"):
        for scope_spans in _list(resource_spans, "scopeSpans"):
            for span in _list(scope_spans, "spans"):
                _convert_fields(span, _SPAN_ID_KEYS, convert)
                for link in _list(span, "links"):
                    _convert_fields(link, _LINK_ID_KEYS, convert)


def _list(obj: Any, key: str) -> list[Any]:
    value = obj.get(key, []) if isinstance(obj, dict) else []
    return value if isinstance(value, list) else []


def _convert_fields(obj: Any, keys: dict[str, int], convert: Any) -> None:
    if not isinstance(obj, dict):
        return
    for key, n_bytes in keys.items():
        value = obj.get(key)
        if isinstance(value, str) and value:
            obj[key] = convert(value, n_bytes, key)


def _b64_to_hex(value: str, n_bytes: int, key: str) -> str:
    return base64.b64decode(value).hex()


def _hex_to_b64(value: str, n_bytes: int, key: str) -> str:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b""
    if len(raw) != n_bytes:
        raise ValueError(f"{key} must be {2 * n_bytes} hex digits, got {value!r}")
    return base64.b64encode(raw).decode("ascii")
