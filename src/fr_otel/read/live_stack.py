"""Where a rank's threads were at incident time: the stacks the live agent took, as data.

The recorder only knows the stack of each rank's last collective. A culprit that never
called the collective its peers wait in is, by definition, somewhere else; the agent
captures every thread's stack at the incident (:mod:`fr_otel.agent.guest.stack_capture`), so
the incident can say "rank 2 is in time.sleep at train.py:27 in main, not in all_reduce #26".
The payload carries them under :data:`PAYLOAD_KEY`; dumps are untrusted, so
:func:`stacks_from_raw` keeps only well-typed, bounded values. No torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..common.json_types import is_exact_number
from .frame import Frame, is_user_frame

__all__ = ["PAYLOAD_KEY", "MAX_THREADS", "MAX_FRAMES", "MAX_TEXT", "DeadThread", "ThreadStack", "LiveStacks",
           "stacks_from_raw"]

#: Top-level key of a dump (as the live agent sends it) with the threads' stacks at incident time.
PAYLOAD_KEY = "fr_otel_now"
MAX_THREADS = 16
MAX_FRAMES = 32
MAX_TEXT = 200  # characters of a name, file path or source line kept
MAX_DEAD = 8  # threads that died of an exception, the latest kept
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread's Python stack, innermost frame first."""

    name: str
    thread_id: int
    frames: tuple[Frame, ...]
    code: str = ""  # the source line of its innermost frame in user code (what it is calling), when readable

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "thread_id": self.thread_id, "code": self.code,
                "frames": [f._asdict() for f in self.frames]}


@dataclass(frozen=True, slots=True)
class DeadThread:
    """A thread of the rank that died of an uncaught exception (the agent's ``threading.excepthook`` saw it): a
    producer whose queue the main thread now waits on forever."""

    name: str
    type: str
    message: str
    where: str  # file:line in function, innermost frame of the traceback

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "message": self.message, "where": self.where}

    def sentence(self) -> str:
        at = f" at {self.where}" if self.where else ""
        return f"thread {self.name} died of {self.type or 'an exception'}: {self.message}{at}"


@dataclass(frozen=True, slots=True)
class LiveStacks:
    """Every (non-agent) thread of a rank at one instant; the main thread first when alive."""

    captured_ns: int
    threads: tuple[ThreadStack, ...]
    in_collective: str | None = None  # the torch.distributed call the main thread is inside, if any
    capture_s: float = 0.0  # what taking it cost
    dead: tuple[DeadThread, ...] = ()  # threads that died of an exception before it, the latest last

    @property
    def main(self) -> ThreadStack | None:
        return self.threads[0] if self.threads else None

    @property
    def where(self) -> Frame | None:
        """The main thread's innermost frame in the user's code (else its innermost)."""
        main = self.main
        if main is None or not main.frames:
            return None
        return next((f for f in main.frames if is_user_frame(f.filename)), main.frames[0])

    @property
    def doing(self) -> str:
        """What the main thread is calling: ``time.sleep``, ``all_reduce``, else its function."""
        if self.in_collective:
            return self.in_collective
        main = self.main
        if main is None or not main.frames:
            return ""
        call = _CALL.search(main.code) if main.code else None
        return call.group(1) if call else main.frames[0].name

    def describe(self) -> str:
        """``in time.sleep at train.py:27 in main`` ("" when the stack is empty)."""
        where = self.where
        if where is None:
            return ""
        return f"in {self.doing or where.name} at {where.filename}:{where.line} in {where.name}"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"captured_ns": self.captured_ns, "in_collective": self.in_collective,
                               "capture_s": round(self.capture_s, 6), "threads": [t.as_json() for t in self.threads]}
        if self.dead:
            out["dead_threads"] = [d.as_json() for d in self.dead]
        return out

    def text(self, max_frames: int = MAX_FRAMES) -> str:
        """The main thread's stack, innermost first, one ``file:line in function`` per line."""
        main = self.main
        if main is None:
            return ""
        return "\n".join(f"{f.filename}:{f.line} in {f.name}" for f in main.frames[:max_frames])


def stacks_from_raw(raw: Any) -> LiveStacks | None:
    """:class:`LiveStacks` from untrusted JSON/pickle data; None when it holds nothing usable."""
    if not isinstance(raw, dict) or not isinstance(raw.get("threads"), list):
        return None
    threads = []
    for t in raw["threads"][:MAX_THREADS]:
        if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
            continue
        frames = tuple(fr for fr in map(_frame, t["frames"][:MAX_FRAMES]) if fr is not None)
        if not frames:
            continue
        tid = t.get("thread_id")
        threads.append(ThreadStack(_text(t.get("name")), tid if type(tid) is int else 0, frames, _text(t.get("code"))))
    captured = raw.get("captured_ns")
    cost = raw.get("capture_s")
    collective = raw.get("in_collective")
    dead = raw.get("dead_threads")
    return LiveStacks(
        captured if type(captured) is int and captured > 0 else 0,
        tuple(threads),
        _text(collective) or None,
        float(cost) if is_exact_number(cost) and 0 <= cost < 1e6 else 0.0,
        tuple(d for d in map(_dead, dead[-MAX_DEAD:] if isinstance(dead, list) else ()) if d is not None),
    ) if threads else None


def _dead(raw: Any) -> DeadThread | None:
    if not isinstance(raw, dict) or not _text(raw.get("name")):
        return None
    return DeadThread(_text(raw.get("name")), _text(raw.get("type")), _text(raw.get("message")),
                      _text(raw.get("where")))


def _frame(raw: Any) -> Frame | None:
    if not isinstance(raw, dict):
        return None
    line = raw.get("line")
    name, filename = _text(raw.get("name")), _text(raw.get("filename"))
    if not filename or type(line) is not int or not 0 <= line < 1 << 31:
        return None
    return Frame(name, filename, line)


def _text(value: Any) -> str:
    if type(value) is not str:
        return ""
    return "".join(c if c.isprintable() else " " for c in value[:MAX_TEXT])
