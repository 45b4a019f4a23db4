"""Take every thread's Python stack now, inside the training process, without stopping it.

``sys._current_frames()`` copies each thread's frame under the GIL for microseconds, so the
incident can say where the culprit's training thread *is*, not only where its last collective
was. Bounded (threads, frames, characters of source); the agent's own threads are left out.
Threads that died of an exception before it (:mod:`.thread_deaths`) go with it. The result is plain
data (:class:`fr_otel.read.live_stack.LiveStacks`) that travels in the payload and ``incident.json``.

The agent's own code also runs on the user's threads: its SIGTERM handler on the main thread (which
waits there while the watcher thread flushes), its exit hooks, the optimizer step hook. Those frames,
and whatever they call, are the agent's, not where the user's code is: each thread's stack starts at
its outermost agent frame's caller (:func:`without_agent_frames`).
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
import time
from types import FrameType

from ...read.frame import Frame, is_user_frame
from ...read.live_stack import MAX_FRAMES, MAX_TEXT, MAX_THREADS, LiveStacks, ThreadStack
from .thread_deaths import DEATHS

__all__ = ["AGENT_THREAD_PREFIX", "capture_stacks", "collective_of", "without_agent_frames"]

#: Every thread the agent starts is named with this prefix, so a capture can leave them out.
AGENT_THREAD_PREFIX = "fr-otel-"
_COLLECTIVE_FILE = "distributed_c10d.py"
_WRAPPERS = frozenset({"wrapper", "_fn", "inner", "decorate_context"})
#: The agent's package folder: a frame whose file is in it is the agent's own (hooks, handlers, bootstrap).
_AGENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def capture_stacks(max_threads: int = MAX_THREADS, max_frames: int = MAX_FRAMES) -> LiveStacks:
    """Every thread's stack now (the calling agent's threads left out); never raises on odd frames."""
    t0 = time.perf_counter()
    frames = sys._current_frames()  # one dict, GIL held only for the copy
    names = {t.ident: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().ident
    order = sorted(frames, key=lambda tid: (tid != main_id, tid))
    threads: list[ThreadStack] = []
    in_collective = None
    for tid in order:
        name = names.get(tid, f"thread-{tid}")
        if name.startswith(AGENT_THREAD_PREFIX):
            continue
        stack: list[Frame] = []
        f: FrameType | None = without_agent_frames(frames[tid])
        while f is not None and len(stack) < max_frames:
            code = f.f_code
            stack.append(Frame(code.co_name[:MAX_TEXT], code.co_filename[-MAX_TEXT:], f.f_lineno or 0))
            f = f.f_back
        user = next((fr for fr in stack if is_user_frame(fr.filename)), stack[0] if stack else None)
        source = linecache.getline(user.filename, user.line).strip()[:MAX_TEXT] if user is not None else ""
        if tid == main_id:
            in_collective = collective_of(stack)
        threads.append(ThreadStack(name[:MAX_TEXT], tid, tuple(stack), source))
        if len(threads) >= max_threads:
            break
    del frames
    return LiveStacks(time.time_ns(), tuple(threads), in_collective, time.perf_counter() - t0, DEATHS.seen())


def without_agent_frames(frame: FrameType | None) -> FrameType | None:
    """The caller of the outermost agent frame on this stack (the agent's frames and all they call
    left out), or ``frame`` itself when none is the agent's or nothing but the agent's is there (a
    thread at interpreter exit runs only the atexit hook: its stack is better than none)."""
    outermost = None
    f = frame
    while f is not None:
        if f.f_code.co_filename.startswith(_AGENT_DIR):
            outermost = f
        f = f.f_back
    if outermost is None or outermost.f_back is None:
        return frame
    return outermost.f_back


def collective_of(stack: list[Frame]) -> str | None:
    """The outermost torch.distributed entry point on the stack (``all_reduce``), if any."""
    found = None
    for f in stack:
        if f.filename.endswith(_COLLECTIVE_FILE) and not f.name.startswith("_") and f.name not in _WRAPPERS:
            found = f.name
    return found
