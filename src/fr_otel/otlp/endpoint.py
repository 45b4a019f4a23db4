"""What an OTLP endpoint must look like before anything dials it: scheme, host, port, no path for gRPC.

A bad endpoint is one ``ValueError`` line naming where it came from (argument or
variable), never echoing a ``user:password@`` it carries.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, urlsplit

from ..common.names import host_name
from ..common.text import printable

__all__ = ["check_endpoint"]


def check_endpoint(protocol: str, value: str, source: str) -> None:
    """Scheme, host and port are checked before anything dials: a bad one is one ValueError line."""
    # Never echo credentials: user:password@ in an endpoint is shown as ***@.
    shown = printable(re.sub(r"(?<=//)[^/@]*@|^[^/@]*@", "***@", value))
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError(f"{source}: endpoint contains spaces or control characters: {shown!r}")
    if protocol == "grpc":
        has_scheme = "://" in value
        parts = _split(value if has_scheme else f"//{value}", source, shown)
        if has_scheme and parts.scheme not in ("http", "https"):
            raise ValueError(f"{source}: a gRPC endpoint is host:port or http[s]://host:port, got {shown!r}")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"{source}: a gRPC endpoint has no path, got {shown!r} (host:port or http[s]://host:port)")
        port = _port(parts, source, shown)
        if port is None and not has_scheme:
            raise ValueError(f"{source}: a gRPC endpoint needs a port (host:port, e.g. localhost:4317), got {shown!r}")
    else:
        parts = _split(value, source, shown)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{source}: OTLP/HTTP endpoint must be an http:// or https:// URL, got {shown!r}")
        _port(parts, source, shown)
    host = parts.hostname or ""
    if parts.username is not None:
        raise ValueError(f"{source}: an endpoint carries no user:password (send credentials as headers), "
                         f"got {shown!r}")
    if not (host_name(host) or ":" in host and _is_ipv6(host)):
        raise ValueError(f"{source}: not a valid host in endpoint {shown!r}")


def _split(value: str, source: str, shown: str) -> SplitResult:
    try:
        return urlsplit(value)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL" for http://[::1
        raise ValueError(f"{source}: {exc} in endpoint {shown!r}") from None


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def _port(parts: SplitResult, source: str, shown: str) -> int | None:
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{source}: port must be a number from 1 to 65535, got endpoint {shown!r}")
    return port
