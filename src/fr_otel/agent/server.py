"""Serve ``/metrics`` for one rank on ``base port + LOCAL_RANK``; a taken port is a log line.

The agent lives inside a training process, so its endpoint must cost a bounded number of
threads whatever connects to it. prometheus_client's own server starts a thread per
connection and never times an idle one out: 150 idle connections took a rank from 7 to 157
threads, on an address (``0.0.0.0`` by default) anyone on the network can reach. This one is
a single thread: a selector over non-blocking sockets, at most :data:`MAX_CONNECTIONS` open
at once (a new one pushes out the longest idle of those open for :data:`PUSH_OUT_AFTER_S`; while
all are younger, new ones wait in the listen backlog), each closed after :data:`IDLE_TIMEOUT_S`
without progress, requests capped at :data:`MAX_REQUEST_BYTES`. A request is answered with
one response, then the connection is closed (Prometheus reconnects each scrape).

The registry holds only the fr-otel collector, so this port shows the same series whatever
else the application registers; the encoder (OpenMetrics when asked for, with exemplars) and
gzip come from prometheus_client, as its server would choose them.
"""

from __future__ import annotations

import gzip
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from ..common.log import logger

__all__ = ["IDLE_TIMEOUT_S", "MAX_CONNECTIONS", "MAX_REQUEST_BYTES", "MetricsServer", "local_rank", "port_for",
           "PUSH_OUT_AFTER_S", "start_metrics_server"]

log = logger("fr_otel.agent")

#: Open connections at once; a new one closes the longest idle (a scrape sends its request at once).
MAX_CONNECTIONS = 32
#: A connection open for less than this is not pushed out: its scrape's request may still be on
#: its way (a burst of 40 scrapes pushed out each other before any request was read).
PUSH_OUT_AFTER_S = 1.0
#: A connection that neither sends its request nor takes its response for this long is closed.
IDLE_TIMEOUT_S = 10.0
#: Request line and headers; Prometheus sends a few hundred bytes.
MAX_REQUEST_BYTES = 16 << 10
_PATHS = (b"/metrics", b"/")


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
        self._accepting = True

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
        timeout = 1.0 if self._accepting else PUSH_OUT_AFTER_S / 4
        for key, events in self.selector.select(timeout=timeout):
            if key.data == "wake":
                return
            if key.fileobj is self.listener:
                self._accept()
                continue
            self._progress(key.fd, events)
        cutoff = time.monotonic() - self.idle_timeout_s
        for conn in [c for c in self.connections.values() if c.last < cutoff]:
            self._close(conn)
        if not self._accepting:  # look at the backlog again: a slot may be free or pushable by now
            self._accepting = True
            self.selector.register(self.listener, selectors.EVENT_READ, None)

    def _progress(self, fd: int, events: int) -> None:
        """Read or write as the connection's stage asks: an event taken before a push-out may name an fd
        that a newly accepted connection now holds."""
        conn = self.connections.get(fd)
        if conn is None:
            return
        if events & selectors.EVENT_READ and conn.response is None:
            self._read(conn)
        elif events & selectors.EVENT_WRITE and conn.response is not None:
            self._write(conn)

    def _accept(self) -> None:
        while True:
            if len(self.connections) >= self.max_connections and not self._make_room():
                self._accepting = False  # the rest wait in the backlog, not in a busy loop
                self.selector.unregister(self.listener)
                return
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: say so once, keep serving what is open
                self._say_once(f"/metrics cannot accept connections: {exc.strerror or exc}")
                return
            sock.setblocking(False)
            now = time.monotonic()
            self.connections[sock.fileno()] = _Connection(sock, now, now)
            self.selector.register(sock, selectors.EVENT_READ, None)

    def _make_room(self) -> bool:
        """Free one slot: answer the requests already waiting, else push out the longest idle of the
        connections open long enough to have sent theirs; False when every one is too young."""
        for key, events in self.selector.select(timeout=0):
            if key.fileobj is not self.listener and key.data != "wake":
                self._progress(key.fd, events)
        if len(self.connections) < self.max_connections:
            return True
        cutoff = time.monotonic() - PUSH_OUT_AFTER_S
        old_enough = [c for c in self.connections.values() if c.opened <= cutoff]
        if not old_enough:
            return False
        self._close(min(old_enough, key=lambda c: c.last))
        return True

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
        conn.request += data
        end = conn.request.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.request) > MAX_REQUEST_BYTES:
                self._respond(conn, b"431 Request Header Fields Too Large", b"text/plain", b"request too large\n")
            return
        self._respond(conn, *self._answer(bytes(conn.request[:end])))

    def _answer(self, head: bytes) -> tuple[bytes, bytes, bytes, list[tuple[bytes, bytes]]]:
        """Status, content type, body and extra headers for one request."""
        lines = head.split(b"\r\n")
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
        self.selector.modify(conn.sock, selectors.EVENT_WRITE, None)
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
