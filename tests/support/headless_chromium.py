"""Headless system Chromium for the HTML report tests, driven by Playwright.

A loaded page records what it did: every request, console messages (CSP violations and
failed loads included), uncaught exceptions, failed requests and JavaScript dialogs
(accepted at once, so one cannot block the load). Playwright drives the system browser
(``executable_path``): no browser download. Every host name resolves to nothing, so a
page cannot reach the network even if it tried; the attempt is still recorded.

    with Chromium.launch() as browser:
        page = browser.open(Path("report.html"))
        assert page.console_errors == [] and page.requests == [page.url]
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Playwright
    from playwright.sync_api import Page as PlaywrightPage

__all__ = ["Chromium", "Page", "find_chromium"]

WIDTH, HEIGHT = 1280, 900
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """A Chromium/Chrome executable: ``$FR_OTEL_CHROMIUM``, /usr/bin/chromium, or one on PATH."""
    explicit = os.environ.get("FR_OTEL_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    return next((found for name in _CANDIDATES if (found := shutil.which(name))), None)


@dataclass
class Page:
    """One loaded page (in its own browser context) and everything it did while loading."""

    page: PlaywrightPage
    url: str
    load_s: float = 0.0
    requests: list[str] = field(default_factory=list)
    console: list[tuple[str, str]] = field(default_factory=list)  # (type, text)
    exceptions: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def console_errors(self) -> list[str]:
        """Errors and warnings the page logged, threw, or the browser logged about it."""
        bad = [f"{kind}: {text}" for kind, text in self.console if kind in ("error", "warning", "assert")]
        return bad + [f"exception: {x}" for x in self.exceptions] + [f"request failed: {x}" for x in self.failed]

    @property
    def external_requests(self) -> list[str]:
        return [u for u in self.requests if u != self.url]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (JSON-serialisable), evaluated in the page."""
        return self.page.evaluate(expression)

    def text(self) -> str:
        return str(self.evaluate("document.body.innerText"))

    def screenshot(self, path: Path | None = None, *, media: str = "screen") -> bytes:
        """A PNG of the whole page as ``media`` ("screen" or "print") shows it; also written to ``path``."""
        self.page.emulate_media(media=media)  # type: ignore[arg-type]
        try:
            return self.page.screenshot(path=path, full_page=True)
        finally:
            self.page.emulate_media(media="no-override")

    def pdf(self, path: Path | None = None) -> bytes:
        """The page printed to PDF (print CSS applies; ``beforeprint`` handlers run)."""
        return self.page.pdf(path=path, print_background=True)

    def close(self) -> None:
        self.page.context.close()


class Chromium:
    """The system Chromium, headless, under Playwright."""

    def __init__(self, playwright: Playwright, browser: Browser) -> None:
        self._playwright, self._browser = playwright, browser

    @classmethod
    def launch(cls, executable: str | None = None) -> Chromium:
        from playwright.sync_api import sync_playwright

        exe = executable or find_chromium()
        if exe is None:
            raise FileNotFoundError("no Chromium found (install Debian's chromium, or set FR_OTEL_CHROMIUM)")
        playwright = sync_playwright().start()
        try:
            browser = playwright.chromium.launch(
                executable_path=exe, args=["--host-resolver-rules=MAP * ~NOTFOUND", "--disable-quic"])
        except BaseException:
            playwright.stop()
            raise
        return cls(playwright, browser)

    def open(self, target: Path, *, javascript: bool = True, settle_s: float = 0.3) -> Page:
        """Load a file in a fresh context and record what it does until it settles."""
        context: BrowserContext = self._browser.new_context(
            java_script_enabled=javascript, viewport={"width": WIDTH, "height": HEIGHT})
        page = Page(context.new_page(), Path(target).resolve().as_uri())
        p = page.page
        p.on("request", lambda r: page.requests.append(r.url))
        p.on("requestfailed", lambda r: page.failed.append(f"{r.url}: {r.failure}"))
        p.on("console", lambda m: page.console.append((m.type, m.text)))
        p.on("pageerror", lambda e: page.exceptions.append(str(e)))
        p.on("dialog", lambda d: (page.dialogs.append(d.message), d.accept()))
        t0 = time.perf_counter()
        p.goto(page.url, wait_until="load")
        page.load_s = time.perf_counter() - t0
        p.wait_for_timeout(settle_s * 1e3)  # late console messages, requests and timers show up
        return page

    def close(self) -> None:
        try:
            self._browser.close()
        finally:
            self._playwright.stop()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
