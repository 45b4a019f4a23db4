"""The cause classes: why a culprit stopped, each with its label, the evidence it needs and the next step.

One table (:data:`CAUSES`), as :mod:`.kinds` holds the culprit kinds: the classifier
(:mod:`.cause`), the JSON, the terminal, the page and docs/verdict.md all read it. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..common.str_enum import StrEnum

__all__ = ["CAUSES", "Cause", "CauseClass", "CauseInfo", "cause_from_json"]


class CauseClass(StrEnum):
    """Why a culprit stopped (JSON ``culprits[i].cause.class``)."""

    PYTHON_BUSY = "python_busy"
    DATA_WAIT = "data_wait"
    LOCK_WAIT = "lock_wait"
    DEADLOCK = "deadlock"
    IO_WAIT = "io_wait"
    GIL_HELD = "gil_held"
    STOPPED = "stopped"
    OOM_KILLED = "oom_killed"
    CRASHED = "crashed"
    EXITED = "exited"
    HOST_LOST = "host_lost"
    SLOW_HOST = "slow_host"
    DEVICE = "device"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class CauseInfo:
    label: str  # what people read
    needs: str  # the evidence that names it (docs/verdict.md's table shows these, checked by tests/diagnosis/test_cause.py)
    next_step: str


CAUSES: Mapping[CauseClass, CauseInfo] = {
    CauseClass.HOST_LOST: CauseInfo(
        "its host is lost", "the verdict's host finding: lost, cut off, or lost with the job's store",
        "look at the host (power, network, kernel) and leave it out of the next run"),
    CauseClass.CRASHED: CauseInfo(
        "crashed", "its exit record: an uncaught exception of its own code (which, and where); or its process gone "
        "without one (a signal, `os._exit`); or SIGTERM when nothing else is known",
        "read the exception and its frame; for a signal, the launcher's log (torchrun: exitcode -N)"),
    CauseClass.EXITED: CauseInfo(
        "left training and exited", "its exit record: it left the interpreter (its script returned, `sys.exit`) "
        "while its peers still wait",
        "find why this rank left the loop early (a step count, an early stop, a condition only it met)"),
    CauseClass.OOM_KILLED: CauseInfo(
        "killed by the OOM killer", "its process gone without an exit record while an OOM-kill counter rose (its "
        "cgroup's, else the host's)",
        "look at its memory use against its cgroup's limit, and the kernel log of its host"),
    CauseClass.STOPPED: CauseInfo(
        "stopped", "`/proc` state `T` or `t` (SIGSTOP, a debugger)",
        "find who stopped it (a debugger, a job control signal) and send it SIGCONT"),
    CauseClass.SLOW_HOST: CauseInfo(
        "its host is slow", "a straggler whose host's other ranks are stragglers too",
        "compare the host with the others: CPU quota, thermal throttling, a noisy neighbour"),
    CauseClass.DEVICE: CauseInfo(
        "stuck inside the collective", "a `not_completed` culprit: it entered the collective and never completed it "
        "(checked before its stack: a rank in `Work.wait()` is inside it)",
        "look at the GPU and NIC of its host (DCGM Xid, NVLink, NIC errors)"),
    CauseClass.DATA_WAIT: CauseInfo(
        "waiting on its data pipeline", "its main thread's live stack in a DataLoader (`torch/utils/data`)",
        "look at the DataLoader workers (their stacks, a stuck worker, storage) on its host"),
    CauseClass.IO_WAIT: CauseInfo(
        "blocked in I/O", "its live stack in a read, recv, open..., or a kernel wait on a pipe, FIFO, socket or "
        "file system; or state `D`",
        "look at what it reads from (a FIFO with no writer, a hung mount, a peer socket)"),
    CauseClass.DEADLOCK: CauseInfo(
        "deadlocked", "its main thread and another thread each in a lock's acquire (or a `with` line while the main "
        "thread waits on a futex), the main thread off the CPU; a thread idle in a condition or a queue is no party",
        "the two acquires are named: take the locks in one order everywhere"),
    CauseClass.LOCK_WAIT: CauseInfo(
        "waiting on a lock", "its main thread in a lock's acquire or a thread's join",
        "find the thread that holds that lock: its stack is in the incident's threads"),
    CauseClass.PYTHON_BUSY: CauseInfo(
        "in its own Python code", "its live stack outside any collective (running, or in `time.sleep`)",
        "read the frame it is in: a loop that never ends, a sleep, a branch only this rank took"),
    CauseClass.GIL_HELD: CauseInfo(
        "native code holds its GIL", "a `missing_dump` culprit: no word from its own agent within the incident's "
        "budget while `/proc` shows its process alive and not stopped (a regex, a `ctypes.PyDLL` call, a C "
        "extension); py-spy's outside read shows the call (`active+gil`)",
        "read the Python stack py-spy took from outside (incident.json's proc.outside_stack; else take one, native "
        "frames too): a regex, a C extension or a ctypes call that never releases the GIL"),
    CauseClass.UNKNOWN: CauseInfo(
        "not known", "nothing beyond the recorder (dump files alone, no agent)",
        "run the job with the agent (fr-otel run) so a host-mate can read its process"),
}
if set(CAUSES) != set(CauseClass):  # pragma: no cover - a typo in the table
    raise RuntimeError("fr_otel.diagnosis.cause: CAUSES must have one row per CauseClass")


@dataclass(frozen=True, slots=True)
class Cause:
    """One culprit's cause: its class and the lines of evidence that name it."""

    cls: CauseClass
    evidence: tuple[str, ...]

    @property
    def said(self) -> bool:
        """Worth a line for people: a class found, or evidence (an ``unknown`` with nothing is only in the JSON)."""
        return self.cls != CauseClass.UNKNOWN or bool(self.evidence)

    @property
    def info(self) -> CauseInfo:
        return CAUSES[self.cls]

    def sentence(self) -> str:
        """``Cause: waiting on its data pipeline (data_wait): main thread in ... .``"""
        head = f"Cause: {self.info.label} ({self.cls})"
        return head + (": " + "; ".join(self.evidence) if self.evidence else "") + "."

    def to_dict(self) -> dict[str, Any]:
        return {"class": str(self.cls), "label": self.info.label, "evidence": list(self.evidence),
                "next": self.info.next_step}


def cause_from_json(raw: Any) -> Cause | None:
    """A recorded cause (an incident file's summary, untrusted); None when ill-typed."""
    if not isinstance(raw, dict) or type(raw.get("class")) is not str or raw["class"] not in set(CauseClass):
        return None
    lines = raw.get("evidence")
    return Cause(CauseClass(raw["class"]), tuple(x[:500] for x in lines[:16] if isinstance(x, str))
                 if isinstance(lines, list) else ())
