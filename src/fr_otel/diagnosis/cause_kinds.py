"""The cause classes: why a culprit stopped, each with its label, the evidence it needs, the next step and
its failure domain.

One table (:data:`CAUSES`), as :mod:`.kinds` holds the culprit kinds: the classifier
(:mod:`.cause`), the JSON, the terminal, the page and docs/verdict.md all read it. The **domain** says whose
fault the evidence points at: the rank's own code or process (``software``: restarting will hang again), the
machine or the network (``infrastructure``: a restart should leave that host out), or neither
(``unknown``). A hang on its own is no evidence against a host; only ``infrastructure`` ever leads to a host
being left out (:mod:`.restart`), and only classes whose evidence is about the machine have it. A class's
domain is its row's, except where the row names one other domain and when the evidence gives it
(``other_domain``, ``domain_when``): the classifier then names it on the cause. The table's order is the classifier's
precedence, from the strongest evidence (the host gone, the process gone) to the weakest (a stack in Python): the
first row whose evidence holds names the cause. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..common.str_enum import StrEnum

__all__ = ["CAUSES", "Cause", "CauseClass", "CauseInfo", "Domain", "cause_from_json"]


class CauseClass(StrEnum):
    """Why a culprit stopped (JSON ``culprits[i].cause.class``)."""

    PYTHON_BUSY = "python_busy"
    NATIVE_BUSY = "native_busy"
    SLEEPING = "sleeping"
    THREAD_WAIT = "thread_wait"
    CHILD_WAIT = "child_wait"
    MEMORY_PRESSURE = "memory_pressure"
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
    CODE_DIVERGENCE = "code_divergence"
    UNKNOWN = "unknown"


class Domain(StrEnum):
    """Whose fault a cause's evidence points at (JSON ``culprits[i].cause.domain``)."""

    SOFTWARE = "software"  # the rank's own code or process: fix the code, a restart hangs again
    INFRASTRUCTURE = "infrastructure"  # the machine or the network: restart elsewhere, leaving the host out
    UNKNOWN = "unknown"  # no evidence either way: restart in place, and collect what was missing


@dataclass(frozen=True, slots=True)
class CauseInfo:
    label: str  # what people read
    needs: str  # the evidence that names it (docs/verdict.md's table shows these, checked by tests/diagnosis/test_cause.py)
    next_step: str
    domain: Domain  # the failure domain, unless the evidence decides otherwise (``domain_when``)
    other_domain: Domain | None = None  # the one other domain the evidence may give it (see ``domain_when``)
    domain_when: str = ""  # when the evidence gives ``other_domain`` (docs/verdict.md's table shows it)


#: In the classifier's order (:func:`fr_otel.diagnosis.cause.find_cause`): the first row whose evidence holds wins.
CAUSES: Mapping[CauseClass, CauseInfo] = {
    CauseClass.HOST_LOST: CauseInfo(
        "its host is lost", "the verdict's host finding: lost, cut off, or lost with the job's store",
        "look at the host (power, network, kernel) and leave it out of the next run",
        Domain.INFRASTRUCTURE),
    CauseClass.CODE_DIVERGENCE: CauseInfo(
        "called another collective than its peers", "a `mismatch` culprit: at the same sequence number on the group "
        "it issued another op, count, shape or dtype than its peers (the recorder shows both)",
        "compare its call site with its peers' (both under Stacks): a rank-dependent branch, a conditional "
        "collective, data of another shape; restarting will hang again until the code is fixed",
        Domain.SOFTWARE),
    CauseClass.CRASHED: CauseInfo(
        "crashed", "its exit record: an uncaught exception of its own code (which, and where); or its process gone "
        "without one (a signal, `os._exit`); or SIGTERM when nothing else is known",
        "read the exception and its frame; for a signal, the launcher's log (torchrun: exitcode -N)",
        Domain.UNKNOWN, Domain.SOFTWARE,
        "when an uncaught exception of its own code was recorded (not one that names the hardware: an ECC "
        "error, a GPU fallen off the bus, an Xid); a signal, `os._exit` or SIGTERM alone says nothing whose it was"),
    CauseClass.EXITED: CauseInfo(
        "left training and exited", "its exit record: it left the interpreter (its script returned, `sys.exit`) "
        "while its peers still wait",
        "find why this rank left the loop early (a step count, an early stop, a condition only it met)",
        Domain.SOFTWARE),
    CauseClass.OOM_KILLED: CauseInfo(
        "killed by the OOM killer", "its process gone without an exit record while an OOM-kill counter rose (its "
        "cgroup's, else the host's)",
        "look at its memory use against its cgroup's limit, and the kernel log of its host",
        Domain.SOFTWARE, Domain.UNKNOWN,
        "when only the host's counter rose: with no memory cgroup of its own, the job's own use or a "
        "neighbour's may have made the kernel kill it"),
    CauseClass.STOPPED: CauseInfo(
        "stopped", "`/proc` state `T` or `t` (SIGSTOP, a debugger)",
        "find who stopped it (a debugger, a job control signal) and send it SIGCONT",
        Domain.UNKNOWN),
    CauseClass.SLOW_HOST: CauseInfo(
        "its host is slow", "a straggler whose host's other ranks are stragglers too",
        "compare the host with the others: CPU quota, thermal throttling, a noisy neighbour",
        Domain.INFRASTRUCTURE),
    CauseClass.DEVICE: CauseInfo(
        "stuck inside the collective", "a `not_completed` culprit: it entered the collective and never completed it "
        "(checked before its stack: a rank in `Work.wait()` is inside it)",
        "look at the GPU and NIC of its host (DCGM Xid, NVLink, NIC errors)",
        Domain.INFRASTRUCTURE),
    CauseClass.DATA_WAIT: CauseInfo(
        "waiting on its data pipeline", "its main thread's live stack in a DataLoader (`torch/utils/data`)",
        "look at the DataLoader workers (their stacks, a stuck worker, storage) on its host",
        Domain.SOFTWARE),
    CauseClass.CHILD_WAIT: CauseInfo(
        "waiting on a child process", "its main thread's live stack in `subprocess` or `multiprocessing` (a pool, a "
        "process's join), or `os.waitpid`, or its kernel wait `do_wait`; its children's pid, command and state",
        "look at the child process named (its stack: `py-spy dump --pid`, its log): why it never ends",
        Domain.SOFTWARE),
    CauseClass.THREAD_WAIT: CauseInfo(
        "waiting on another thread of its process", "its main thread in a queue's get or put, a thread's join or a "
        "future's result, or in an Event's or Condition's wait while a thread of its process died of an exception "
        "(the agent's `threading.excepthook` kept it); the other threads' places and deaths",
        "read the other thread named: where it is stuck, or the exception it died of (its traceback is on stderr)",
        Domain.SOFTWARE),
    CauseClass.DEADLOCK: CauseInfo(
        "deadlocked", "its main thread and another thread each in a lock's acquire (or a `with` line while the main "
        "thread waits on a futex), the main thread off the CPU; a thread idle in a condition or a queue is no party",
        "the two acquires are named: take the locks in one order everywhere",
        Domain.SOFTWARE),
    CauseClass.LOCK_WAIT: CauseInfo(
        "waiting on a lock", "its main thread in a lock's acquire",
        "find the thread that holds that lock: its stack is in the incident's threads",
        Domain.SOFTWARE),
    CauseClass.SLEEPING: CauseInfo(
        "asleep by its own code", "its main thread in `time.sleep` or an Event's or Condition's wait that no thread "
        "will end, or asleep in the kernel (state `S`, under 0.1 core, a kernel wait other than a futex) where no wait "
        "below is named",
        "read the frame it sleeps in: a sleep, a wait nobody will set, a retry loop's back-off",
        Domain.SOFTWARE),
    CauseClass.MEMORY_PRESSURE: CauseInfo(
        "at its memory limit", "its memory cgroup at 95 % or more of its limit and hitting it during the sample "
        "(v1 `memory.failcnt`, v2 `memory.events` max): reclaim, not its code, holds it (checked before I/O: a page "
        "cache thrash reads as I/O)",
        "look at its memory use against its cgroup's limit (a leak, a cache that grows, a limit too low for the job)",
        Domain.SOFTWARE),
    CauseClass.IO_WAIT: CauseInfo(
        "blocked in I/O", "its live stack in a read, recv, open..., or a kernel wait on a pipe, FIFO, socket or "
        "file system; or state `D`",
        "look at what it reads from (a FIFO with no writer, a hung mount, a peer socket)",
        Domain.SOFTWARE, Domain.UNKNOWN,
        "when the process is in uninterruptible sleep (`D`): a hung mount, shared storage or writeback "
        "holds it, not its own code, and one read cannot tell whose"),
    CauseClass.NATIVE_BUSY: CauseInfo(
        "busy in native code", "its main thread on the CPU in a call with no Python frame below it (a torch op, a C "
        "extension)",
        "read the call it is in: a compute far larger than meant (a shape, a loop around it), or a native library "
        "that never returns",
        Domain.SOFTWARE),
    CauseClass.PYTHON_BUSY: CauseInfo(
        "in its own Python code", "its live stack outside any collective, its main thread on the CPU in Python (a "
        "line with no call, or a call with its Python frame below)",
        "read the frame it is in: a loop that never ends, a branch only this rank took",
        Domain.SOFTWARE),
    CauseClass.GIL_HELD: CauseInfo(
        "native code holds its GIL", "a culprit that sent no part (`missing_dump`, or known only from its node-local "
        "last record): no word from its own agent within the incident's "
        "budget while `/proc` shows its process alive and not stopped (a regex, a `ctypes.PyDLL` call, a C "
        "extension); py-spy's outside read shows the call (`active+gil`)",
        "read the Python stack py-spy took from outside (incident.json's proc.outside_stack; else take one, native "
        "frames too): a regex, a C extension or a ctypes call that never releases the GIL",
        Domain.SOFTWARE),
    CauseClass.UNKNOWN: CauseInfo(
        "not known", "nothing beyond the recorder (dump files alone, no agent)",
        "run the job with the agent (fr-otel run) so a host-mate can read its process",
        Domain.UNKNOWN),
}
if set(CAUSES) != set(CauseClass):  # pragma: no cover - a typo in the table
    raise RuntimeError("fr_otel.diagnosis.cause: CAUSES must have one row per CauseClass")


@dataclass(frozen=True, slots=True)
class Cause:
    """One culprit's cause: its class, the lines of evidence that name it, and its failure domain."""

    cls: CauseClass
    evidence: tuple[str, ...]
    #: The domain the evidence decided, where it overrides the class's (its row's ``other_domain``).
    evidence_domain: Domain | None = None

    def __post_init__(self) -> None:
        if self.evidence_domain is not None and self.evidence_domain not in (CAUSES[self.cls].domain,
                                                                             CAUSES[self.cls].other_domain):
            raise ValueError(f"cause {self.cls} cannot be {self.evidence_domain}: its row allows "
                             f"{CAUSES[self.cls].domain} or {CAUSES[self.cls].other_domain}")

    @property
    def domain(self) -> Domain:
        """Whose fault: the evidence's word where it decided, else the class's."""
        return self.evidence_domain or CAUSES[self.cls].domain

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
        return {"class": str(self.cls), "label": self.info.label, "domain": str(self.domain),
                "evidence": list(self.evidence), "next": self.info.next_step}


def cause_from_json(raw: Any) -> Cause | None:
    """A recorded cause (an incident file's summary, untrusted); None when ill-typed."""
    if not isinstance(raw, dict) or type(raw.get("class")) is not str or raw["class"] not in set(CauseClass):
        return None
    lines = raw.get("evidence")
    domain = raw.get("domain")
    cls = CauseClass(raw["class"])
    # Only the one other domain the class's row allows: a file cannot make a code fault evidence against a host.
    other = CAUSES[cls].other_domain
    said = other if other is not None and domain == other else None
    return Cause(cls, tuple(x[:500] for x in lines[:16] if isinstance(x, str)) if isinstance(lines, list) else (),
                 said)
