"""Serve ``/metrics`` for one rank on ``base port + LOCAL_RANK``; a taken port is a log line.

The agent lives inside a training process, so its endpoint must cost a bounded number of
threads whatever connects to it. prometheus_client's own server starts a thread per
connection and never times an idle one out: 150 idle connections took a rank from 7 to 157
threads, on an address (``0.0.0.0`` by default) anyone on the network can reach. This one is
a single thread: a selector over non-blocking sockets, at most :data:`MAX_CONNECTIONS` open
at once (past that, the requests already in are answered, then a new one pushes out the longest
idle of those open for :data:`PUSH_OUT_AFTER_S`; younger ones, whose requests may be on their
way, are kept up to twice the cap, beyond which the longest idle goes whatever its age: a burst of
scrapes is answered, a flood of connections never holds the next scrape back), each closed after :data:`IDLE_TIMEOUT_S`
without progress, requests capped at :data:`MAX_REQUEST_BYTES`. A request is answered with
one response, then the connection is closed (Prometheus reconnects each scrape).

The registry holds only the fr-otel collector, so this port shows the same series whatever
else the application registers; the encoder (OpenMetrics when asked for, with exemplars) and
gzip come from prometheus_client, as its server would choose them.
"""

from __future__ import annotations

import gzip
import os
import re
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from ...common.log import logger

__all__ = ["IDLE_TIMEOUT_S", "MAX_CONNECTIONS", "MAX_REQUEST_BYTES", "MetricsServer", "gzip_accepted", "local_rank",
           "port_for", "PUSH_OUT_AFTER_S", "start_metrics_server"]

log = logger("fr_otel.agent")

#: Open connections at once (twice that while the newest are younger than PUSH_OUT_AFTER_S).
MAX_CONNECTIONS = 32
#: A connection open for less than this is not pushed out below twice the cap: its scrape's request
#: may still be on its way (a burst of 40 scrapes pushed out each other before any was read).
PUSH_OUT_AFTER_S = 1.0
#: A connection that neither sends its request nor takes its response for this long is closed.
IDLE_TIMEOUT_S = 10.0
#: Request line and headers; Prometheus sends a few hundred bytes.
MAX_REQUEST_BYTES = 16 << 10
_PATHS = (b"/metrics", b"/")
#: The end of a request's head: a blank line, CRLF or bare LF (RFC 9112 lets a server take LF alone).
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_LINE_END = re.compile(rb"\r?\n")


def local_rank(environ: dict[str, str] | None = None) -> int | None:
    """LOCAL_RANK (torchrun), else SLURM_LOCALID; None when neither says."""
    env = os.environ if environ is None else environ
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        raw = env.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


def port_for(base: int, local: int | None) -> int:
    """``base + local rank``; 0 stays 0 (any free port)."""
    return 0 if base == 0 else base + (local or 0)


@dataclass(slots=True)
class _Connection:
    sock: socket.socket
    last: float  # monotonic time of its last progress
    opened: float  # monotonic time it was accepted
    request: bytearray = field(default_factory=bytearray)
    response: memoryview | None = None


class _Loop:
    """The one thread: accept, read requests, write responses, close the idle and the finished."""

    def __init__(self, listener: socket.socket, registry: CollectorRegistry, idle_timeout_s: float,
                 max_connections: int) -> None:
        self.listener = listener
        self.registry = registry
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.selector = selectors.DefaultSelector()
        self.connections: dict[int, _Connection] = {}
        self.stopping = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, None)
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._said: set[str] = set()

    def run(self) -> None:
        try:
            while not self.stopping:
                try:
                    self._once()
                except Exception as exc:  # noqa: BLE001 - the endpoint must outlive its own surprises
                    self._say_once(f"/metrics: {type(exc).__name__}: {exc}; still serving")
        finally:
            for conn in list(self.connections.values()):
                self._close(conn)
            self.selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def stop(self) -> None:
        self.stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _once(self) -> None:
        for key, events in self.selector.select(timeout=1.0):
            if key.data == "wake":
                return
            if key.fileobj is self.listener:
                self._accept()
            else:
                self._progress(key, events)
        cutoff = time.monotonic() - self.idle_timeout_s
        for conn in [c for c in self.connections.values() if c.last < cutoff]:
            self._close(conn)

    def _progress(self, key: selectors.SelectorKey, events: int) -> None:
        """Read or write as the connection's stage asks. An event taken before a push-out may name an fd
        a newly accepted connection now holds: it counts only for the connection it was taken for. A
        connection whose request breaks the answer (a malformed Accept header) is closed alone."""
        conn = key.data
        if not isinstance(conn, _Connection) or self.connections.get(key.fd) is not conn:
            return
        try:
            if events & selectors.EVENT_READ and conn.response is None:
                self._read(conn)
            elif events & selectors.EVENT_WRITE and conn.response is not None:
                self._write(conn)
        except Exception as exc:  # noqa: BLE001 - one client's request must not stop the others' answers
            self._say_once(f"/metrics: a request failed ({type(exc).__name__}: {exc}); that connection is closed")
            self._close(conn)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: say so once, keep serving what is open
                self._say_once(f"/metrics cannot accept connections: {exc.strerror or exc}")
                return
            sock.setblocking(False)
            if len(self.connections) >= self.max_connections:
                self._make_room()
            now = time.monotonic()
            conn = _Connection(sock, now, now)
            self.connections[sock.fileno()] = conn
            self.selector.register(sock, selectors.EVENT_READ, conn)

    def _make_room(self) -> None:
        """At the cap: answer the requests already in; then push out the longest idle of the connections
        open long enough to have sent theirs, or, at twice the cap, the longest idle of all."""
        for key, events in self.selector.select(timeout=0):
            if isinstance(key.data, _Connection):
                self._progress(key, events)
        if len(self.connections) < self.max_connections:
            return
        cutoff = time.monotonic() - PUSH_OUT_AFTER_S
        old_enough = [c for c in self.connections.values() if c.opened <= cutoff]
        if old_enough or len(self.connections) >= 2 * self.max_connections:
            self._close(min(old_enough or self.connections.values(), key=lambda c: c.last))

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.last = time.monotonic()
        # Only the new bytes (and the 3 before them, a split line end) are searched: a slow client's
        # byte at a time must not cost a pass over its whole request each.
        start = max(len(conn.request) - 3, 0)
        conn.request += data
        end = _HEAD_END.search(conn.request, start)
        if end is None:
            if len(conn.request) > MAX_REQUEST_BYTES:
                self._respond(conn, b"431 Request Header Fields Too Large", b"text/plain", b"request too large\n")
            return
        self._respond(conn, *self._answer(bytes(conn.request[:end.start()])))

    def _answer(self, head: bytes) -> tuple[bytes, bytes, bytes, list[tuple[bytes, bytes]]]:
        """Status, content type, body and extra headers for one request."""
        lines = _LINE_END.split(head)
        parts = lines[0].split(b" ")
        if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD"):
            return b"405 Method Not Allowed", b"text/plain", b"GET /metrics\n", []
        if parts[1].split(b"?", 1)[0] not in _PATHS:
            return b"404 Not Found", b"text/plain", b"GET /metrics\n", []
        headers: dict[bytes, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().decode("latin-1")
        encoder, content_type = choose_encoder(headers.get(b"accept", ""))
        body = encoder(self.registry)
        extra: list[tuple[bytes, bytes]] = []
        if gzip_accepted(headers.get(b"accept-encoding", "")):
            body = gzip.compress(body)
            extra.append((b"Content-Encoding", b"gzip"))
        if parts[0] == b"HEAD":
            extra.append((b"Content-Length", str(len(body)).encode()))
            body = b""
        return b"200 OK", content_type.encode("latin-1"), body, extra

    def _respond(self, conn: _Connection, status: bytes, content_type: bytes, body: bytes,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
        head = [b"HTTP/1.1 " + status, b"Content-Type: " + content_type, b"Connection: close"]
        if not any(name == b"Content-Length" for name, _ in extra or ()):
            head.append(b"Content-Length: " + str(len(body)).encode())
        head += [name + b": " + value for name, value in extra or ()]
        conn.response = memoryview(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Connection) -> None:
        assert conn.response is not None
        try:
            sent = conn.sock.send(conn.response)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        conn.last = time.monotonic()
        conn.response = conn.response[sent:]
        if not conn.response:
            self._close(conn)

    def _close(self, conn: _Connection) -> None:
        self.connections.pop(conn.sock.fileno(), None)
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _say_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            log.warning("%s", message)


def gzip_accepted(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` value accepts gzip: named (or ``*``) with a quality above 0;
    ``gzip;q=0`` says it is not acceptable (RFC 9110 12.5.3), which prometheus_client's test ignores."""
    quality: dict[str, float] = {}
    for item in accept_encoding.split(","):
        name, *params = (p.strip() for p in item.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
                q = q if 0.0 <= q <= 1.0 else 0.0  # nan or out of range: not a yes
        quality.setdefault(name.lower(), q)
    return quality.get("gzip", quality.get("x-gzip", quality.get("*", 0.0))) > 0


@dataclass(slots=True)
class MetricsServer:
    """A running ``/metrics`` endpoint."""

    addr: str
    port: int
    _loop: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.addr in ("", "0.0.0.0") else ("[::1]" if self.addr == "::" else self.addr)
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self._loop.stop()
        self._thread.join(timeout=5)
        self._loop.listener.close()


def start_metrics_server(collector: Collector, port: int, addr: str = "0.0.0.0", *,
                         idle_timeout_s: float = IDLE_TIMEOUT_S,
                         max_connections: int = MAX_CONNECTIONS) -> MetricsServer | None:
    """Serve ``collector`` on ``addr:port`` from one daemon thread; None (after one warning) when
    that fails."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        listener = socket.create_server((addr, port), family=family, backlog=64)
        listener.setblocking(False)
    except (OSError, OverflowError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        log.warning("cannot serve /metrics on %s:%d (%s); this rank's metrics are off, training continues. "
                    "Pick another base port with FR_OTEL_METRICS_PORT.", addr, port, why)
        return None
    loop = _Loop(listener, registry, idle_timeout_s, max_connections)
    thread = threading.Thread(target=loop.run, name="fr-otel-metrics", daemon=True)
    thread.start()
    return MetricsServer(addr=addr, port=int(listener.getsockname()[1]), _loop=loop, _thread=thread)
