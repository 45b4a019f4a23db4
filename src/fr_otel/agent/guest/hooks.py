"""Flush on the way out: at exit, on an uncaught exception, on SIGTERM; always chaining.

- ``atexit``: registered last, so it runs before torch's own exit handlers.
- ``sys.excepthook``: the previous hook runs first, and the flush waits for the ``atexit``
  hook: torch's own excepthook wraps ours and holds back the output of the hooks it wraps
  until they return, so a flush inside ours would print the user's traceback only after it
  (seconds later, or never on a hung node). Without our ``atexit`` hook (or off the main
  thread) the flush runs in the excepthook itself.
- ``SIGTERM`` (main thread only, as Python requires): a Python handler runs only when the
  main thread returns to the interpreter, and a rank stuck in a collective never does. So
  the agent also sets the signal wakeup fd (when nobody else, e.g. asyncio, holds it): the
  C-level handler writes the signal number to a pipe at once, a watcher thread flushes,
  and then, if the previous disposition was the default (and nobody replaced the agent's
  handler since), restores it and re-sends SIGTERM, so the process still dies of SIGTERM,
  just after the flush. A previous Python handler is called from the main thread as
  usual; SIG_IGN stays ignored. A SIGTERM that comes while an exit flush runs (an uncaught exception's, the
  atexit hook's: torchrun tears down a node whose other worker failed) waits for that flush, which its one
  budget bounds, and is acted on as above once it returns.

Child processes (``fork``) inherit hooks but not the agent: every hook checks the pid and
only chains there. All flushes are bounded by the caller's timeout.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

__all__ = ["ExitHooks"]


class ExitHooks:
    """Installs and removes the three hooks; the callbacks must be bounded and never raise."""

    def __init__(
        self,
        names: tuple[str, ...],
        on_exit: Callable[[], None],
        on_exception: Callable[[BaseException], None],
        on_sigterm: Callable[[], None],
    ) -> None:
        self.names = names
        self._on_exit = on_exit
        self._on_exception = on_exception
        self._on_sigterm = on_sigterm
        self._pid = os.getpid()
        self._prev_excepthook: Callable[..., Any] | None = None
        self._prev_sigterm: Any = None
        self._sigterm_installed = False
        self._wakeup: tuple[int, int] | None = None
        self._sigterm_once = threading.Lock()
        self._sigterm_done = threading.Event()
        self._pending: BaseException | None = None  # an uncaught exception the atexit hook flushes
        #: An exit flush runs (the uncaught exception's, the atexit hook's): a SIGTERM now (torchrun's, as it tears
        #: down a node whose other worker failed) waits for it, bounded by its one budget, and is acted on once it
        #: returns: this rank's part in the incident its failure raises is what the SIGTERM would cut short.
        self._flushing = False
        self._deferred_sigterm = False
        self.installed: list[str] = []

    # -- install / uninstall ------------------------------------------------------------
    def install(self) -> list[str]:
        if "atexit" in self.names:
            atexit.register(self._atexit)
            self.installed.append("atexit")
        if "excepthook" in self.names:
            self._prev_excepthook = sys.excepthook
            sys.excepthook = self._excepthook
            self.installed.append("excepthook")
        if "sigterm" in self.names and threading.current_thread() is threading.main_thread():
            self._prev_sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm_installed = True
            self.installed.append("sigterm")
            self._install_wakeup()
        return self.installed

    def _install_wakeup(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return
        if old != -1:  # someone (asyncio, ...) owns it: give it back, rely on the Python handler
            signal.set_wakeup_fd(old)
            os.close(r)
            os.close(w)
            return
        self._wakeup = (r, w)
        threading.Thread(target=self._watch, args=(r,), name="fr-otel-signals", daemon=True).start()
        self.installed.append("sigterm-wakeup-fd")

    def uninstall(self) -> None:
        """Put back what was there, where ours is still the installed one."""
        if "atexit" in self.installed:
            atexit.unregister(self._atexit)
        if "excepthook" in self.installed and sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook or sys.__excepthook__
        if self._sigterm_installed and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) == self._sigterm:
                signal.signal(signal.SIGTERM, self._prev_sigterm if self._prev_sigterm is not None else signal.SIG_DFL)
            if self._wakeup is not None:
                try:
                    current = signal.set_wakeup_fd(-1)
                    if current != self._wakeup[1]:
                        signal.set_wakeup_fd(current)  # someone replaced it after us: theirs now
                finally:
                    os.close(self._wakeup[1])  # the watcher's read returns EOF and it exits
                    self._wakeup = None
        self.installed = []

    def after_fork_in_child(self) -> None:
        """In a forked child: stop listening on the parent's pipe (the hooks themselves only chain)."""
        if self._wakeup is not None:
            try:
                signal.set_wakeup_fd(-1)
            except (ValueError, OSError):
                pass
            self._wakeup = None

    # -- the hooks ----------------------------------------------------------------------
    def _ours(self) -> bool:
        return os.getpid() == self._pid

    def _atexit(self) -> None:
        if self._ours():
            logging.getLogger("fr_otel.agent").debug("atexit hook runs")
            pending, self._pending = self._pending, None
            self._exit_flush(pending)

    def _exit_flush(self, exc: BaseException | None, *, at_exit: bool = True) -> None:
        """The exception's flush (when ``exc``) and the exit's (when ``at_exit``); a SIGTERM that came meanwhile
        is acted on after it, as it would have been (the previous handler, else the default: death by SIGTERM)."""
        self._flushing = True
        try:
            if exc is not None:
                self._on_exception(exc)
            if at_exit:
                self._on_exit()
        finally:
            self._flushing = False
            if self._deferred_sigterm:
                self._deferred_sigterm = False
                if threading.current_thread() is threading.main_thread():
                    self._chain(signal.SIGTERM, None)
                elif self._prev_sigterm in (signal.SIG_DFL, None):
                    _die_of_sigterm()

    def _excepthook(self, etype: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        prev = self._prev_excepthook or sys.__excepthook__
        try:
            prev(etype, value, tb)
        finally:
            if self._ours():
                if "atexit" in self.installed and threading.current_thread() is threading.main_thread():
                    self._pending = value  # the traceback goes out first; the atexit hook flushes
                else:
                    self._exit_flush(value, at_exit=False)

    def _defer_sigterm(self) -> None:
        if not self._deferred_sigterm:
            self._deferred_sigterm = True
            logging.getLogger("fr_otel.agent").info("SIGTERM during this rank's exit flush: it finishes the flush "
                                                    "first (within its budget), then acts on it")

    def _flush_sigterm_once(self) -> None:
        if self._sigterm_once.acquire(blocking=False):
            try:
                self._on_sigterm()
            finally:
                self._sigterm_done.set()
        else:
            self._sigterm_done.wait()  # the other path is flushing; the callback is bounded

    def _sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._ours() and self._flushing:
            self._defer_sigterm()
            return
        if self._ours():
            self._flush_sigterm_once()
        self._chain(signum, frame)

    def _chain(self, signum: int, frame: FrameType | None) -> None:
        prev = self._prev_sigterm
        if callable(prev):
            prev(signum, frame)
        elif prev == signal.SIG_IGN:
            return
        else:  # SIG_DFL, or a handler not installed from Python: die of SIGTERM as before
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def _watch(self, fd: int) -> None:
        try:
            self._watch_loop(fd)
        finally:
            try:
                os.close(fd)
            except OSError:
                pass

    def _watch_loop(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data and self._ours():
                if self._flushing:
                    self._defer_sigterm()  # the exit flush acts on it once it returns
                    continue
                self._flush_sigterm_once()
                still_ours = signal.getsignal(signal.SIGTERM) == self._sigterm  # else someone else decides
                if still_ours and self._prev_sigterm in (signal.SIG_DFL, None):
                    # The main thread may be stuck in a collective forever: end the process
                    # the way SIGTERM would have, now that the recorder is out.
                    _die_of_sigterm()
                # Keep reading until uninstall closes the write end: a read end closed while the wakeup fd is
                # still set makes every later signal print a BrokenPipeError from the C handler.


def _die_of_sigterm() -> None:
    """Default SIGTERM disposition, then SIGTERM: from any thread (``signal.signal`` is
    main-thread only, libc's ``signal`` is not); exit status 143 if that fails."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(int(signal.SIGTERM), None)  # NULL is SIG_DFL
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    except Exception:  # noqa: BLE001, S110 - no libc signal(): the plain exit below
        pass
    os._exit(128 + int(signal.SIGTERM))
