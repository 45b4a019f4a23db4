"""Threads of the rank that died of an uncaught exception: a ``threading.excepthook`` the agent installs keeps each one.

A producer thread that raises dies quietly (its traceback goes to stderr, nobody joins it), and the main thread
then waits forever on the queue it fed: the hang's cause is that death, seconds or hours before the stall. The
hook keeps the latest :data:`~fr_otel.read.live_stack.MAX_DEAD` deaths (name, exception, innermost frame), chains to
the previous hook (the traceback still prints), and the stack capture sends them with the threads' stacks
(:class:`fr_otel.read.live_stack.DeadThread`). Never raises; a forked child's hook only chains.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections import deque
from typing import Any

from ...read.live_stack import MAX_DEAD, MAX_TEXT, DeadThread

__all__ = ["DEATHS", "ThreadDeaths"]


class ThreadDeaths:
    """Installs and removes the hook; :meth:`seen` is what it kept, oldest first."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._kept: deque[DeadThread] = deque(maxlen=MAX_DEAD)
        self._previous: Any = None

    def install(self) -> None:
        self._previous = threading.excepthook
        threading.excepthook = self._hook

    def uninstall(self) -> None:
        if threading.excepthook == self._hook:
            threading.excepthook = self._previous or threading.__excepthook__

    def seen(self) -> tuple[DeadThread, ...]:
        return tuple(self._kept)

    def _hook(self, args: Any) -> None:
        try:
            if os.getpid() == self._pid and args.exc_type is not SystemExit:
                frames = traceback.extract_tb(args.exc_traceback) if args.exc_traceback is not None else []
                last = frames[-1] if frames else None
                where = f"{last.filename}:{last.lineno} in {last.name}"[-MAX_TEXT:] if last is not None else ""
                name = args.thread.name if args.thread is not None else "?"
                self._kept.append(DeadThread(str(name)[:MAX_TEXT], args.exc_type.__name__[:MAX_TEXT],
                                             str(args.exc_value)[:MAX_TEXT], where))
        except Exception:  # noqa: BLE001 - never the user's thread's problem
            pass
        (self._previous or threading.__excepthook__)(args)


#: The process's one record (the hook is process-wide): the agent installs it, the stack capture reads it.
DEATHS = ThreadDeaths()
