"""Where and how traces are exported: every OTLP environment variable fr-otel honours.

The SDK's exporter classes read some of these variables themselves, but not all
(``OTEL_EXPORTER_OTLP_PROTOCOL`` is only read by auto-configuration) and they retry
inside their own timeout. fr-otel sends the protobufs itself (see
:mod:`fr_otel.otlp.export`), so it resolves the configuration here, once, with the
precedence the OpenTelemetry specification uses everywhere::

    explicit argument > OTEL_EXPORTER_OTLP_TRACES_* > OTEL_EXPORTER_OTLP_* > default

``ExportConfig.endpoint is None`` means nobody configured an endpoint: callers then
write the embedded OTLP JSON file instead of guessing that a collector listens on
``localhost``. :meth:`ExportConfig.target` still gives the specification's default
for a caller that wants to try it anyway.

Bad values raise ``ValueError`` with a one-line message naming the variable (endpoints
are checked by :mod:`fr_otel.otlp.endpoint`; TLS files, before dialling, by
:mod:`fr_otel.otlp.tls_files`); a caller that must keep exporting passes ``warnings`` and
gets the default for a bad inherited timeout, insecure flag or compression instead.

Usage::

    config = resolve_export_config()                  # from os.environ
    config = resolve_export_config(protocol="http/protobuf", endpoint="http://otel:4318/v1/traces")
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar
from urllib.parse import unquote

from ..common.commands import shown_endpoint
from ..common.text import printable
from .endpoint import check_endpoint

__all__ = [
    "DEFAULT_GRPC_ENDPOINT",
    "DEFAULT_HTTP_ENDPOINT",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_PROTOCOL",
    "DEFAULT_TIMEOUT_S",
    "ENV_VARS",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_SDK_DISABLED",
    "PROTOCOLS",
    "Compression",
    "ExportConfig",
    "Protocol",
    "check_headers",
    "parse_headers",
    "resolve_export_config",
]

Protocol = Literal["grpc", "http/protobuf", "http/json"]
Compression = Literal["gzip", "none"]
_T = TypeVar("_T")
_S = TypeVar("_S", bound=str)

# --- Environment variables (names as in the OpenTelemetry specification) -------------

#: Base endpoint for every signal. gRPC uses it as is; OTLP/HTTP appends ``/v1/traces``.
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
#: Endpoint for traces only; used verbatim by both protocols.
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
#: ``grpc``, ``http/protobuf`` or ``http/json``. The SDK's exporter classes ignore it.
OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
#: Protocol for traces only.
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
#: Extra request headers / gRPC metadata: ``key=value,key2=value2``, values URL-encoded.
OTEL_EXPORTER_OTLP_HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
#: Headers for traces only (replaces, does not merge with, the generic ones).
OTEL_EXPORTER_OTLP_TRACES_HEADERS = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
#: Per-request timeout in seconds, as the Python SDK reads it (the specification says
#: milliseconds; Python never did). fr-otel also bounds the whole export by its deadline.
OTEL_EXPORTER_OTLP_TIMEOUT = "OTEL_EXPORTER_OTLP_TIMEOUT"
#: Timeout for traces only.
OTEL_EXPORTER_OTLP_TRACES_TIMEOUT = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
#: ``gzip`` or ``none``.
OTEL_EXPORTER_OTLP_COMPRESSION = "OTEL_EXPORTER_OTLP_COMPRESSION"
#: Compression for traces only.
OTEL_EXPORTER_OTLP_TRACES_COMPRESSION = "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"
#: PEM file of trusted roots for the collector's TLS certificate.
OTEL_EXPORTER_OTLP_CERTIFICATE = "OTEL_EXPORTER_OTLP_CERTIFICATE"
#: Trusted roots for traces only.
OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE = "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE"
#: PEM private key for mutual TLS.
OTEL_EXPORTER_OTLP_CLIENT_KEY = "OTEL_EXPORTER_OTLP_CLIENT_KEY"
#: Client key for traces only.
OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY = "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY"
#: PEM client certificate chain for mutual TLS.
OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
#: Client certificate for traces only.
OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE = "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE"
#: ``true``: plaintext gRPC for an endpoint given without ``http://``/``https://``.
OTEL_EXPORTER_OTLP_INSECURE = "OTEL_EXPORTER_OTLP_INSECURE"
#: Insecure flag for traces only.
OTEL_EXPORTER_OTLP_TRACES_INSECURE = "OTEL_EXPORTER_OTLP_TRACES_INSECURE"
#: ``true`` turns every export into a no-op.
OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"

#: Every variable this module reads, for documentation and ``--help`` output.
ENV_VARS: tuple[str, ...] = (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_EXPORTER_OTLP_HEADERS,
    OTEL_EXPORTER_OTLP_TRACES_HEADERS,
    OTEL_EXPORTER_OTLP_TIMEOUT,
    OTEL_EXPORTER_OTLP_TRACES_TIMEOUT,
    OTEL_EXPORTER_OTLP_COMPRESSION,
    OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
    OTEL_EXPORTER_OTLP_CERTIFICATE,
    OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE,
    OTEL_EXPORTER_OTLP_CLIENT_KEY,
    OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY,
    OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE,
    OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE,
    OTEL_EXPORTER_OTLP_INSECURE,
    OTEL_EXPORTER_OTLP_TRACES_INSECURE,
    OTEL_SDK_DISABLED,
)

# --- Defaults ---------------------------------------------------------------------------

#: The Python SDK's ``otlp`` exporter is gRPC, so fr-otel defaults to it too.
DEFAULT_PROTOCOL: Protocol = "grpc"
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318/v1/traces"
DEFAULT_TIMEOUT_S = 10.0
#: Collector and Tempo gRPC receivers reject requests over 4 MiB; keep a margin.
DEFAULT_MAX_REQUEST_BYTES = 3_670_016  # 3.5 MiB

#: Every protocol fr-otel exports with (one list for every command and the agent).
PROTOCOLS: tuple[Protocol, ...] = ("grpc", "http/protobuf", "http/json")
_COMPRESSIONS: tuple[Compression, ...] = ("gzip", "none")
_TRACES_PATH = "/v1/traces"


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """Resolved OTLP trace export settings; build it with :func:`resolve_export_config`."""

    protocol: Protocol = DEFAULT_PROTOCOL
    #: ``None``: nothing configured (write the embedded file instead). For HTTP this is
    #: the full URL including ``/v1/traces``; for gRPC ``host:port`` or a URL.
    endpoint: str | None = None
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    compression: Compression = "none"
    certificate_file: str | None = None
    client_key_file: str | None = None
    client_certificate_file: str | None = None
    #: ``None``: not set; only consulted for gRPC endpoints without a scheme.
    insecure: bool | None = None
    disabled: bool = False
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES

    def target(self) -> str:
        """The endpoint to dial: the configured one, else the specification's default."""
        if self.endpoint is not None:
            return self.endpoint
        return DEFAULT_GRPC_ENDPOINT if self.protocol == "grpc" else DEFAULT_HTTP_ENDPOINT

    def shown_target(self) -> str:
        """:meth:`target` as it may be printed (logs, lines, the report): query values masked."""
        return shown_endpoint(self.target())


def parse_headers(value: str, *, source: str = "headers") -> dict[str, str]:
    """Parse ``k=v,k2=v2`` (URL-encoded) into lower-case keys; ``source`` names it in errors."""
    headers: dict[str, str] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        key = unquote(key).strip().lower()
        if not sep or not key or any(c.isspace() for c in key):
            raise ValueError(f"{source}: expected 'key=value[,key2=value2]', got {printable(item.strip())!r}")
        headers[key] = unquote(val).strip()
    return check_headers(headers, source)


def resolve_export_config(
    *,
    protocol: str | None = None,
    endpoint: str | None = None,
    headers: Mapping[str, str] | str | None = None,
    timeout_s: float | None = None,
    compression: str | None = None,
    certificate_file: str | None = None,
    client_key_file: str | None = None,
    client_certificate_file: str | None = None,
    insecure: bool | None = None,
    disabled: bool | None = None,
    max_request_bytes: int | None = None,
    environ: Mapping[str, str] | None = None,
    warnings: list[str] | None = None,
) -> ExportConfig:
    """Resolve each setting: explicit argument > ``*_TRACES_*`` env > generic env > default.

    ``environ`` defaults to ``os.environ`` (pass a dict in tests). An explicit endpoint is
    used verbatim, like the signal-specific variable. With a ``warnings`` list, a bad
    protocol, headers, timeout, insecure flag, compression or ``OTEL_SDK_DISABLED`` read from a
    variable is one line there and the default is used, so an inherited typo does not stop the
    export; a bad argument still raises.
    """
    env = os.environ if environ is None else environ

    def lenient(parse: Callable[[], _T], source: str, default: _T) -> _T:
        try:
            return parse()
        except ValueError as exc:
            if warnings is None or source == "argument":
                raise
            warnings.append(f"{exc}; using the default ({_shown(default)})")
            return default

    def pick(arg: _T | None, traces_var: str, generic_var: str) -> tuple[_T | str | None, str]:
        if arg is not None:
            return arg, "argument"
        for var in (traces_var, generic_var):
            raw = env.get(var, "").strip()
            if raw:
                return raw, var
        return None, ""

    raw_protocol, src = pick(protocol, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL)
    proto = lenient(lambda: _choice(raw_protocol, src, PROTOCOLS, DEFAULT_PROTOCOL), src, DEFAULT_PROTOCOL)

    resolved_endpoint = _endpoint(proto, endpoint, env)

    hdrs: dict[str, str] = {}
    if headers is not None and not isinstance(headers, str):
        hdrs = check_headers(dict(headers), "headers argument")
    else:
        raw_headers, src = pick(headers, OTEL_EXPORTER_OTLP_TRACES_HEADERS, OTEL_EXPORTER_OTLP_HEADERS)
        if raw_headers is not None:
            hdrs = lenient(lambda: parse_headers(raw_headers, source=src), src, {})

    raw_timeout, src = pick(timeout_s, OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, OTEL_EXPORTER_OTLP_TIMEOUT)
    timeout = (DEFAULT_TIMEOUT_S if raw_timeout is None
               else lenient(lambda: _positive_float(raw_timeout, src, "seconds"), src, DEFAULT_TIMEOUT_S))

    raw_comp, src = pick(compression, OTEL_EXPORTER_OTLP_TRACES_COMPRESSION, OTEL_EXPORTER_OTLP_COMPRESSION)
    comp: Compression = lenient(lambda: _choice(raw_comp, src, _COMPRESSIONS, "none"), src, "none")

    cert, _ = pick(certificate_file, OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE, OTEL_EXPORTER_OTLP_CERTIFICATE)
    key, _ = pick(client_key_file, OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY, OTEL_EXPORTER_OTLP_CLIENT_KEY)
    chain, _ = pick(
        client_certificate_file,
        OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE,
        OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE,
    )
    if (key is None) != (chain is None):
        raise ValueError(
            f"mutual TLS needs both {OTEL_EXPORTER_OTLP_CLIENT_KEY} and "
            f"{OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE} (or their TRACES_ forms), got only one"
        )

    raw_insecure, src = pick(insecure, OTEL_EXPORTER_OTLP_TRACES_INSECURE, OTEL_EXPORTER_OTLP_INSECURE)
    insec = None if raw_insecure is None else lenient(lambda: _bool(raw_insecure, src), src, None)

    if disabled is not None:
        is_disabled = bool(disabled)
    else:
        raw = env.get(OTEL_SDK_DISABLED, "").strip()
        is_disabled = lenient(lambda: _bool(raw, OTEL_SDK_DISABLED), OTEL_SDK_DISABLED, False) if raw else False

    max_bytes = DEFAULT_MAX_REQUEST_BYTES if max_request_bytes is None else int(max_request_bytes)
    if max_bytes < 1024:
        raise ValueError(f"max_request_bytes: must be at least 1024, got {max_bytes}")

    return ExportConfig(
        protocol=proto,
        endpoint=resolved_endpoint,
        headers=hdrs,
        timeout_s=timeout,
        compression=comp,
        certificate_file=cert,
        client_key_file=key,
        client_certificate_file=chain,
        insecure=insec,
        disabled=is_disabled,
        max_request_bytes=max_bytes,
    )


def _endpoint(protocol: str, explicit: str | None, env: Mapping[str, str]) -> str | None:
    """Explicit and signal-specific endpoints are verbatim; HTTP appends the path to the generic one."""
    specific = env.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "").strip()
    generic = env.get(OTEL_EXPORTER_OTLP_ENDPOINT, "").strip()
    if explicit is not None and explicit.strip():
        value, source = explicit.strip(), "endpoint argument"
    elif specific:
        value, source = specific, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    elif generic:
        value, source = generic, OTEL_EXPORTER_OTLP_ENDPOINT
        if protocol != "grpc":
            check_endpoint(protocol, value, source)
            value = value.rstrip("/") + _TRACES_PATH
    else:
        return None
    check_endpoint(protocol, value, source)
    return value


_HEADER_KEY = re.compile(r"[0-9a-z_.-]+")  # what gRPC metadata allows; a subset of HTTP's tokens


def check_headers(headers: Mapping[str, str], source: str = "headers") -> dict[str, str]:
    """Lower-case keys gRPC accepts and values without control characters (they would end the header)."""
    out: dict[str, str] = {}
    for key, value in headers.items():
        key = str(key).strip().lower()
        value = str(value)
        if not _HEADER_KEY.fullmatch(key):
            raise ValueError(f"{source}: header name {printable(key)!r} may only hold a-z, 0-9, '-', '_' and '.'")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise ValueError(f"{source}: the value of header {key!r} contains control characters (a newline?)")
        if not value.isascii():
            raise ValueError(f"{source}: the value of header {key!r} is not ASCII (URL-encode it)")
        out[key] = value
    return out


def _shown(default: object) -> str:
    if default is None:  # the insecure flag: unset means TLS unless the endpoint says http://
        return "TLS unless the endpoint is http://"
    if isinstance(default, dict):
        return "no headers"
    if isinstance(default, bool):
        return str(default).lower()
    return f"{default:g} s" if isinstance(default, float) else str(default)


def _choice(raw: object, source: str, allowed: tuple[_S, ...], default: _S) -> _S:
    if raw is None:
        return default
    value = str(raw).strip().lower()
    for option in allowed:  # the option itself: its type is the setting's (a Literal)
        if option == value:
            return option
    raise ValueError(f"{source or 'argument'}: expected one of {', '.join(allowed)}; got {raw!r}")


def _positive_float(raw: float | str, source: str, unit: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: expected a number of {unit}, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{source}: expected a positive finite number of {unit}, got {raw!r}")
    return value


def _bool(raw: object, source: str) -> bool:
    if isinstance(raw, bool):
        return raw
    value = str(raw).strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    raise ValueError(f"{source}: expected 'true' or 'false', got {raw!r}")
