"""Headless Chromium, driven over the DevTools protocol with a stdlib-only WebSocket client.

For tests that must see a page as a browser renders it: console errors, uncaught
exceptions, every request the page makes, JavaScript dialogs, ``document.body.innerText``
and screenshots. No third-party package: the WebSocket client (RFC 6455, client side:
HTTP upgrade, masked frames, fragmentation, ping/pong) is a few dozen lines.

    with Chromium.launch() as browser:
        page = browser.open("/tmp/report.html")
        assert not page.console_errors and page.requests == [page.url]
        png = page.screenshot()

Chromium runs with no network access: ``--host-resolver-rules`` maps every host name to
nothing, and background networking, sync, component updates and QUIC are off. The
browser is a child of this process, in its own process group, and is ended by its pid.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CdpError", "Chromium", "Page", "WebSocket", "find_chromium"]

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """A Chromium/Chrome executable: ``$FR_OTEL_CHROMIUM``, /usr/bin/chromium, or one on PATH."""
    explicit = os.environ.get("FR_OTEL_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


class CdpError(RuntimeError):
    """The browser answered a command with an error, died, or did not answer in time."""


# --------------------------------------------------------------------------- WebSocket (client side)


class WebSocket:
    """A minimal RFC 6455 client: text messages in and out, over plain TCP (ws://)."""

    def __init__(self, host: str, port: int, path: str, timeout: float = 30.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise CdpError("connection closed during the WebSocket handshake")
            head += chunk
        head, _, self._buf = head.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise CdpError(f"WebSocket upgrade refused: {status.decode(errors='replace')}")

    def send(self, text: str) -> None:
        payload = text.encode()
        n = len(payload)
        header = bytearray([0x81])  # FIN + text
        if n < 126:
            header.append(0x80 | n)
        elif n < 1 << 16:
            header.append(0x80 | 126)
            header += struct.pack("!H", n)
        else:
            header.append(0x80 | 127)
            header += struct.pack("!Q", n)
        mask = os.urandom(4)
        header += mask
        masked = bytes(b ^ mask[i & 3] for i, b in enumerate(payload)) if n < 4096 else _mask_fast(payload, mask)
        self.sock.sendall(bytes(header) + masked)

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise CdpError("the browser closed the DevTools connection")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def recv(self) -> str:
        """The next complete text message (control frames handled on the way)."""
        parts: list[bytes] = []
        while True:
            b0, b1 = self._read(2)
            fin, opcode = b0 & 0x80, b0 & 0x0F
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            data = self._read(n)
            if mask:
                data = _mask_fast(data, mask)
            if opcode == 0x9:  # ping
                self._control(0xA, data)
                continue
            if opcode == 0xA:
                continue
            if opcode == 0x8:
                raise CdpError("the browser closed the DevTools connection")
            parts.append(data)
            if fin:
                return b"".join(parts).decode()

    def _control(self, opcode: int, data: bytes) -> None:
        mask = os.urandom(4)
        self.sock.sendall(bytes([0x80 | opcode, 0x80 | len(data)]) + mask + _mask_fast(data, mask))

    def close(self) -> None:
        try:
            self._control(0x8, struct.pack("!H", 1000))
        except OSError:
            pass
        self.sock.close()


def _mask_fast(data: bytes, mask: bytes) -> bytes:
    n = len(data)
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(data, "big") ^ key).to_bytes(n, "big")


# --------------------------------------------------------------------------- the browser


@dataclass
class Page:
    """One loaded page and everything it did while loading."""

    browser: Chromium
    session: str
    url: str
    load_s: float = 0.0
    requests: list[str] = field(default_factory=list)
    console: list[tuple[str, str]] = field(default_factory=list)  # (level, text)
    exceptions: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def console_errors(self) -> list[str]:
        """Errors and warnings the page logged, threw, or the browser logged about it."""
        bad = [f"{lvl}: {text}" for lvl, text in self.console if lvl in ("error", "warning", "assert")]
        return bad + [f"exception: {x}" for x in self.exceptions] + [f"request failed: {x}" for x in self.failed]

    @property
    def external_requests(self) -> list[str]:
        return [u for u in self.requests if u != self.url]

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
        return self.browser.send(method, params, session=self.session, timeout=timeout)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (JSON-serialisable), evaluated in the page."""
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            raise CdpError(f"evaluating {expression!r} threw: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def text(self) -> str:
        return str(self.evaluate("document.body.innerText"))

    def screenshot(self, path: str | os.PathLike[str] | None = None, *, full_page: bool = True,
                   media: str = "screen", selector: str | None = None, scale: float = 1) -> bytes:
        """A PNG of the page (the whole page by default, or the element ``selector`` picks),
        also written to ``path`` if given."""
        self.send("Emulation.setEmulatedMedia", {"media": media})
        try:
            params: dict[str, Any] = {"format": "png"}
            if selector is not None:
                box = self.evaluate(
                    f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                    " return [r.left + scrollX, r.top + scrollY, r.width, r.height]; })()")
                params.update(captureBeyondViewport=True,
                              clip={"x": box[0], "y": box[1], "width": box[2], "height": box[3], "scale": scale})
            elif full_page:
                metrics = self.send("Page.getLayoutMetrics")
                size = metrics.get("cssContentSize") or metrics["contentSize"]
                width = self.browser.width
                height = min(int(size["height"]) + 1, 16000)
                params.update(captureBeyondViewport=True,
                              clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
            data = base64.b64decode(self.send("Page.captureScreenshot", params, timeout=120)["data"])
        finally:
            self.send("Emulation.setEmulatedMedia", {"media": ""})
        if path is not None:
            Path(path).write_bytes(data)
        return data

    def pdf(self, path: str | os.PathLike[str] | None = None) -> bytes:
        """The page printed to PDF (print CSS applies; ``beforeprint`` handlers run)."""
        data = base64.b64decode(self.send("Page.printToPDF", {"printBackground": True}, timeout=120)["data"])
        if path is not None:
            Path(path).write_bytes(data)
        return data

    def close(self) -> None:
        try:
            self.browser.send("Target.closeTarget", {"targetId": self.session_target})
        except CdpError:
            pass

    session_target: str = ""


class Chromium:
    """A headless Chromium process and one DevTools connection to it."""

    def __init__(self, proc: subprocess.Popen[bytes], ws: WebSocket, profile: str, log_path: str, width: int) -> None:
        self.proc = proc
        self.ws = ws
        self.profile = profile
        self.log_path = log_path
        self.width = width
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    @classmethod
    def launch(cls, executable: str | None = None, *, width: int = 1280, height: int = 900,
               timeout: float = 30.0) -> Chromium:
        exe = executable or find_chromium()
        if exe is None:
            raise FileNotFoundError("no Chromium found (install Debian's chromium, or set FR_OTEL_CHROMIUM)")
        profile = tempfile.mkdtemp(prefix="fr-otel-chromium-")
        log_path = os.path.join(profile, "chromium.log")
        args = [
            exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-extensions", "--disable-default-apps", "--disable-breakpad",
            "--disable-domain-reliability", "--metrics-recording-only", "--mute-audio", "--hide-scrollbars",
            "--host-resolver-rules=MAP * ~NOTFOUND", "--disable-dev-shm-usage",
            f"--window-size={width},{height}", f"--user-data-dir={profile}",
            "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1", "about:blank",
        ]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=hasattr(os, "setsid"))
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while True:
            if port_file.is_file():
                lines = port_file.read_text().split()
                if len(lines) >= 2:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop(proc)
                tail = Path(log_path).read_text(errors="replace")[-2000:]
                shutil.rmtree(profile, ignore_errors=True)
                raise CdpError(f"Chromium did not start (exit {proc.returncode}); log tail:\n{tail}")
            time.sleep(0.05)
        port, path = int(lines[0]), lines[1]
        try:
            ws = WebSocket("127.0.0.1", port, path, timeout=timeout)
        except (OSError, CdpError):
            _stop(proc)
            shutil.rmtree(profile, ignore_errors=True)
            raise
        return cls(proc, ws, profile, log_path, width)

    # -- protocol

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
             timeout: float = 60.0) -> dict[str, Any]:
        self._next_id += 1
        my_id = self._next_id
        msg: dict[str, Any] = {"id": my_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            reply = self._recv(deadline, method)
            if reply.get("id") == my_id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def _recv(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CdpError(f"no answer from Chromium in time (waiting for {waiting_for})")
        self.ws.sock.settimeout(left)
        try:
            msg = json.loads(self.ws.recv())
        except TimeoutError:
            raise CdpError(f"no answer from Chromium in time (waiting for {waiting_for})") from None
        if msg.get("method") == "Page.javascriptDialogOpening":
            # A dialog blocks the page (and its load event): record it, dismiss it at once.
            self.events.append(msg)
            self.send("Page.handleJavaScriptDialog", {"accept": True}, session=msg.get("sessionId"), timeout=10)
            return {"method": "fr_otel.dialogHandled", "sessionId": msg.get("sessionId")}
        return msg

    def wait_event(self, method: str, session: str, timeout: float = 60.0) -> dict[str, Any]:
        for i, ev in enumerate(self.events):
            if ev.get("method") == method and ev.get("sessionId") == session:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            ev = self._recv(deadline, method)
            if ev.get("method") == method and ev.get("sessionId") == session:
                return ev
            if "method" in ev:
                self.events.append(ev)

    # -- pages

    def open(self, target: str | os.PathLike[str], *, javascript: bool = True, timeout: float = 60.0,
             settle_s: float = 0.3) -> Page:
        """Load a file (or URL) in a fresh tab and record what it does until it settles."""
        url = target if isinstance(target, str) and "://" in target else Path(target).resolve().as_uri()
        tid = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": tid, "flatten": True})["sessionId"]
        page = Page(self, session, url)
        page.session_target = tid
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.send(f"{domain}.enable")
        page.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": 900, "deviceScaleFactor": 1, "mobile": False})
        if not javascript:
            page.send("Emulation.setScriptExecutionDisabled", {"value": True})
        self.events = [e for e in self.events if e.get("sessionId") != session]
        t0 = time.perf_counter()
        nav = page.send("Page.navigate", {"url": url}, timeout=timeout)
        if nav.get("errorText"):
            raise CdpError(f"navigation to {url} failed: {nav['errorText']}")
        self.wait_event("Page.loadEventFired", session, timeout=timeout)
        page.load_s = time.perf_counter() - t0
        # Let late console messages, requests and timers show up, then collect.
        end = time.monotonic() + settle_s
        try:
            while time.monotonic() < end:
                self.events.append(self._recv(end, "settle"))
        except CdpError:
            pass
        self._collect(page)
        return page

    def _collect(self, page: Page) -> None:
        keep = []
        for ev in self.events:
            if ev.get("sessionId") != page.session:
                keep.append(ev)
                continue
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Network.requestWillBeSent":
                page.requests.append(p.get("request", {}).get("url", ""))
            elif m == "Network.loadingFailed":
                page.failed.append(f"{p.get('errorText')} ({p.get('blockedReason') or p.get('type')})")
            elif m == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                page.console.append((p.get("type", "log"), text))
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                page.exceptions.append(str(d.get("exception", {}).get("description") or d.get("text")))
            elif m == "Log.entryAdded":
                entry = p.get("entry", {})
                page.console.append((entry.get("level", "info"), f"[{entry.get('source')}] {entry.get('text')} "
                                     f"{entry.get('url', '')}".strip()))
            elif m == "Page.javascriptDialogOpening":
                page.dialogs.append(str(p.get("message")))
        self.events = keep

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (CdpError, OSError):
            pass
        try:
            self.ws.close()
        except OSError:
            pass
        _stop(self.proc)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:  # noqa: PYI034 - no subclasses
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the browser we started (by its pid), then its process group if anything lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    if hasattr(os, "killpg"):
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # our own session: renderer/zygote children left behind
        except (ProcessLookupError, PermissionError):
            pass
