"""What a rank's host saw of its process, and how the rank left: the evidence for *why* it stopped.

A rank's own agent runs inside it, under its GIL: a rank that is stopped, holds the GIL in native code
or is gone can say nothing of itself. Another process on its host still can: every rank's agent reads,
at incident time, ``/proc`` of its host's ranks (:mod:`fr_otel.agent.observe.proc_state`) and sends
what it saw with its own recorder (:data:`HOST_VIEW_KEY`, rank -> :class:`ProcessFacts`). And a rank
that leaves says how, while it can (:data:`EXIT_KEY`, an :class:`ExitRecord`: the uncaught
exception, a normal exit, SIGTERM) in its exit copy. Both travel in payloads and in ``incident.json``;
both are untrusted input, so :func:`facts_from_raw` and :func:`exit_from_raw` keep only well-typed,
bounded values. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..common.json_types import is_exact_number
from ..common.text import printable

__all__ = ["EXIT_KEY", "HOST_VIEW_KEY", "ChildFacts", "ExitRecord", "ProcessFacts", "ThreadFacts", "exit_from_raw",
           "facts_from_raw", "host_view_from_raw", "merge_facts"]

#: Top-level payload key (and ``proc`` in a rank's entry of incident.json) with what its host saw of it.
HOST_VIEW_KEY = "fr_otel_host_view"
#: Top-level payload key (and ``exit`` in incident.json) with how the rank left.
EXIT_KEY = "fr_otel_exit"
#: Process states ``/proc/<pid>/stat`` gives, and ``gone`` for a process that no longer exists.
STATES = frozenset("RSDTtZXIWPK") | {"gone"}
#: exception: its own code raised; failure: a collective failed on it (what a hang ends in); exit: it left the
#: interpreter (its script returned, sys.exit); sigterm: it was told to stop.
EXIT_HOWS = ("exception", "failure", "exit", "sigterm")
_MAX_TEXT = 300
_MAX_THREADS = 8
_MAX_CHILDREN = 8
_MAX_VIEW = 1024  # ranks per host view: a host runs a handful


def _text(value: Any, limit: int = _MAX_TEXT) -> str:
    return printable(value)[:limit] if type(value) is str else ""


def _count(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value < 1 << 62 else None


def _share(value: Any) -> float:
    return float(value) if is_exact_number(value) and 0 <= value <= 1024 else 0.0


@dataclass(frozen=True, slots=True)
class ThreadFacts:
    """One thread of the process: its name, kernel state, CPU share of a core over the sample, kernel wait."""

    tid: int
    name: str
    state: str
    cpu: float
    wchan: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"tid": self.tid, "name": self.name, "state": self.state, "cpu": round(self.cpu, 3),
                "wchan": self.wchan}


@dataclass(frozen=True, slots=True)
class ChildFacts:
    """A child process of the rank's main thread (``subprocess.run``, a pool's worker): what it waits on."""

    pid: int
    state: str
    command: str

    def as_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "state": self.state, "command": self.command}


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    """One rank's process as a process on its host read it from ``/proc`` (no ptrace)."""

    pid: int
    state: str  # the main thread's: R running, S sleeping, D uninterruptible (I/O), T stopped, Z zombie; "gone"
    cpu: float = 0.0  # the whole process's CPU over the sample, in cores
    wchan: str = ""  # where in the kernel its main thread sleeps ("" when running or unreadable)
    threads: tuple[ThreadFacts, ...] = ()  # the busiest threads first (at most 8), the main thread always among them
    oom_kills: int | None = None  # OOM kills its memory cgroup counted since the reader's agent started (None: unknown)
    host_oom_kills: int | None = None  # ... the host's (/proc/vmstat oom_kill), the same way
    sample_s: float = 0.0  # how long the CPU was measured over
    sampled_ns: int = 0
    seen_by: int | None = None  # the rank whose agent read it
    outside_stack: str = ""  # its Python stacks as py-spy read them from outside (non-blocking), where permitted
    children: tuple[ChildFacts, ...] = ()  # its main thread's child processes (at most 8)
    memory_use: float | None = None  # its memory cgroup's usage as a share of its limit (None: no limit, unknown)
    memory_limit_hits: int | None = None  # times its memory cgroup hit its limit during the sample (None: unknown)

    @property
    def gone(self) -> bool:
        return self.state in ("gone", "Z", "X")

    @property
    def main_thread(self) -> ThreadFacts | None:
        """Its main thread (tid = pid) where kept: the process's CPU also counts the agent's own threads, which
        work hardest during the very incident that reads them."""
        return next((t for t in self.threads if t.tid == self.pid), None)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": self.pid, "state": self.state, "cpu": round(self.cpu, 3), "wchan": self.wchan,
                               "threads": [t.as_json() for t in self.threads], "sample_s": round(self.sample_s, 3),
                               "sampled_ns": self.sampled_ns}
        for key in ("oom_kills", "host_oom_kills", "seen_by"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.outside_stack:
            out["outside_stack"] = self.outside_stack
        if self.children:
            out["children"] = [c.as_json() for c in self.children]
        if self.memory_use is not None:
            out["memory_use"] = round(self.memory_use, 4)
        if self.memory_limit_hits is not None:
            out["memory_limit_hits"] = self.memory_limit_hits
        return out


@dataclass(frozen=True, slots=True)
class ExitRecord:
    """How a rank left: ``exception`` (type, message, where), ``failure`` (a collective failed on it), ``exit``,
    ``sigterm``."""

    how: str
    type: str = ""
    message: str = ""
    where: str = ""  # file:line in function, innermost frame of the traceback
    code: int | None = None
    at_ns: int = 0

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"how": self.how, "at_ns": self.at_ns}
        for key in ("type", "message", "where"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.code is not None:
            out["code"] = self.code
        return out


def merge_facts(kept: ProcessFacts | None, other: ProcessFacts) -> ProcessFacts:
    """Two reads of one rank's process as one: the newer, with the other's outside stack when it has none (only
    the host's lowest rank takes one; its read need not be the newest)."""
    if kept is None:
        return other
    newer, older = (other, kept) if other.sampled_ns > kept.sampled_ns else (kept, other)
    if not newer.outside_stack and older.outside_stack and older.pid == newer.pid:
        return replace(newer, outside_stack=older.outside_stack)
    return newer


def _thread(raw: Any) -> ThreadFacts | None:
    if not isinstance(raw, dict):
        return None
    tid, state = _count(raw.get("tid")), raw.get("state")
    if tid is None or type(state) is not str or state not in STATES:
        return None
    return ThreadFacts(tid, _text(raw.get("name"), 64), state, _share(raw.get("cpu")), _text(raw.get("wchan"), 64))


def _child(raw: Any) -> ChildFacts | None:
    if not isinstance(raw, dict):
        return None
    pid, state = _count(raw.get("pid")), raw.get("state")
    if pid is None or type(state) is not str or state not in STATES:
        return None
    return ChildFacts(pid, state, _text(raw.get("command"), 200))


def facts_from_raw(raw: Any) -> ProcessFacts | None:
    """:class:`ProcessFacts` from untrusted data; None when it is not one."""
    if not isinstance(raw, dict):
        return None
    pid, state = _count(raw.get("pid")), raw.get("state")
    if pid is None or type(state) is not str or state not in STATES:
        return None
    threads, children = raw.get("threads"), raw.get("children")
    seen_by = _count(raw.get("seen_by"))
    use = raw.get("memory_use")
    return ProcessFacts(
        pid, state, _share(raw.get("cpu")), _text(raw.get("wchan"), 64),
        tuple(t for t in map(_thread, threads[:_MAX_THREADS] if isinstance(threads, list) else ()) if t is not None),
        _count(raw.get("oom_kills")), _count(raw.get("host_oom_kills")), _share(raw.get("sample_s")),
        _count(raw.get("sampled_ns")) or 0, seen_by,
        printable(raw["outside_stack"][:4000], keep_lines=True)[:4000] if type(raw.get("outside_stack")) is str else "",
        tuple(c for c in map(_child, children[:_MAX_CHILDREN] if isinstance(children, list) else ()) if c is not None),
        float(use) if is_exact_number(use) and 0 <= use <= 1024 else None, _count(raw.get("memory_limit_hits")))


def host_view_from_raw(raw: Any) -> dict[int, ProcessFacts]:
    """rank -> facts, from a payload's :data:`HOST_VIEW_KEY` (rank keys as ints or ASCII digits)."""
    out: dict[int, ProcessFacts] = {}
    if not isinstance(raw, dict):
        return out
    for key, value in list(raw.items())[:_MAX_VIEW]:
        rank = key if type(key) is int else int(key) if isinstance(key, str) and key.isascii() and key.isdigit() \
            and len(key) < 11 else None
        facts = facts_from_raw(value)
        if rank is not None and facts is not None:
            out[rank] = facts
    return out


def exit_from_raw(raw: Any) -> ExitRecord | None:
    """:class:`ExitRecord` from untrusted data; None when it is not one."""
    if not isinstance(raw, dict) or type(raw.get("how")) is not str or raw["how"] not in EXIT_HOWS:
        return None
    code = raw.get("code")
    return ExitRecord(raw["how"], _text(raw.get("type"), 128), _text(raw.get("message")), _text(raw.get("where")),
                      code if type(code) is int and -256 < code < 256 else None, _count(raw.get("at_ns")) or 0)
