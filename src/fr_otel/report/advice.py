"""What to do next, per culprit kind: the runbook step on every card of the page and under every
culprit in the terminal.

Kept apart from the layouts because it is the product's operational knowledge (which command on
which host, what to look for), reviewed by different people than the markup. A step is a
sequence of parts, plain text and :class:`Code` (a command or a literal), so the page shows
commands in ``<code>`` (:func:`as_html`) and the terminal in backticks (:func:`as_text`).

A process that is gone cannot be ``py-spy``'d: after a watchdog dump (NCCL aborts the process once
it has written one) or an incident raised as the job ended, the step points at what is left, the
rank's log and its host's kernel log (:func:`process_gone`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..common.commands import py_spy_command_line
from ..common.ranks import compress_ranks
from ..diagnosis.cause_kinds import Cause, CauseClass
from ..diagnosis.kinds import CulpritKind, VerdictWord, check_table
from ..diagnosis.verdict import Culprit, Verdict
from ..read.dump import op_name
from ..read.incident_file import LIVE_INCIDENT_SOURCE
from .markup import esc

__all__ = ["Code", "Step", "as_html", "as_lines", "as_text", "general_next_step", "next_step", "process_gone"]

#: Sources of a rank's process record that saw it alive at incident time (the agent's payload,
#: the ranks.json a live incident wrote beside its incident.json); a ranks.json alone may be the
#: one written at start-up, and says nothing of the end.
_LIVE_SOURCES = ("agent", LIVE_INCIDENT_SOURCE)


class Code(str):
    """A command or literal: ``<code>`` on the page, in backticks on the terminal."""

    __slots__ = ()


Step = tuple[str, ...]  # plain text and Code parts, in reading order


def as_html(step: Step) -> str:
    """The step as escaped HTML, commands in ``<code>`` (dump text goes through :func:`esc`)."""
    return "".join(f"<code>{esc(p, 400)}</code>" if isinstance(p, Code) else esc(p) for p in step)


def as_text(step: Step) -> str:
    """The step as one terminal line, commands in backticks."""
    return "".join(f"`{p}`" if isinstance(p, Code) else p for p in step)


_SENTENCE_END = re.compile(r"(?<=\.) (?=[A-Z])")


def as_lines(step: Step) -> list[str]:
    """:func:`as_text`, one sentence a line: a step for a terminal that a person reads down."""
    return _SENTENCE_END.split(as_text(step))


def process_gone(v: Verdict, c: Culprit) -> str | None:
    """Why rank ``c``'s process is gone, in a few words, or None when it may still run."""
    if v.job_ended:
        return "the incident was raised as the job ended"
    if c.now is not None or (c.process is not None and c.process.source in _LIVE_SOURCES):
        return None  # the live agent saw it running at incident time
    if "nccl" in v.backends:
        return "NCCL aborts a process once its watchdog has written a dump like this"
    return None  # gloo never dumps itself: someone pulled this one from a live process


def _py_spy(c: Culprit, what: str = "dump") -> Code:
    """The py-spy command for this culprit, with its real host and pid when known (shell-quoted:
    people paste it)."""
    p = c.process
    host = p.host if p is not None and p.host else c.host
    return Code(py_spy_command_line(what, p.pid if p is not None else None, host))


def _gone(r: int, why: str, c: Culprit) -> Step:
    """Where to look for a rank whose process is gone, and the py-spy step should it still run."""
    return (f" Its process is gone ({why}): look at rank {r}'s log (its last lines, a traceback) and its host's "
            "kernel log (", Code("dmesg -T"), ": the OOM killer, a segfault). If it still runs, ", _py_spy(c),
            " shows where it is.")


def _not_enqueued(v: Verdict, c: Culprit, r: int, op: str, seq: str, gone: str | None) -> Step:
    head = f"Rank {r} never reached {op} {seq}: its Python was somewhere else."
    if gone:
        return (head, *_gone(r, gone, c), *((" Its last recorded call site is under Stacks.",)
                                            if c.last_frame is not None else ()))
    return (f"{head} Find out where: ", _py_spy(c), " (add ", Code("--native"), " for C++ frames) on rank "
            f"{r}'s process while it is still alive, its stacks below, and its log (a stuck data loader, "
            "checkpoint or file I/O, an exception in a different code path, a held GIL, a rank-dependent branch "
            "that skips the collective).")


def _not_completed(v: Verdict, c: Culprit, r: int, op: str, seq: str, gone: str | None) -> Step:
    if "nccl" in v.backends:
        return (f"Rank {r} entered {op} {seq} but its GPU or network never finished it while its peers did. "
                "Check that host's GPU and NIC: ", Code("dmesg | grep -i xid"), " and DCGM health (",
                Code("dcgmi health -c"), ") for XID / ECC errors, ", Code("nvidia-smi -q"), ", the NIC's "
                "link state and error counters (", Code("ibstat"), ", ", Code("ethtool -S"), "). Then the NCCL "
                "log (", Code("NCCL_DEBUG=INFO"), ") around the reference time.")
    head: Step = (f"Rank {r} entered {op} {seq} but never finished it while its peers did. Check that host's network "
                  "(TCP connectivity to its peers, ", Code("ss -tnp"), ", interface errors) and whether the process "
                  "is starved of CPU.")
    if gone:
        return (*head, *_gone(r, gone, c))
    return (*head, " ", _py_spy(c), f" shows where rank {r} is blocked.")


def _mismatch(v: Verdict, c: Culprit, r: int, op: str, seq: str, gone: str | None) -> Step:
    return (f"Rank {r} called a different collective than its peers at {seq or 'the same point'}. Compare the "
            "two call sites (under Stacks): typically a rank-dependent branch, a conditional collective, or "
            "tensors whose shapes or dtypes differ across ranks. Fix the code so every rank issues the same "
            "sequence of collectives on this group.",)


def _missing_dump(v: Verdict, c: Culprit, r: int, op: str, seq: str, gone: str | None) -> Step:
    return (f"There is no dump from rank {r}. Find out whether its process was alive at dump time (OOM killer, "
            "crash, lost node: the scheduler's and the node's logs, ", Code("dmesg"), "). Make sure every rank "
            "can dump next time (", Code("TORCH_NCCL_DUMP_ON_TIMEOUT=1"), ", a writable ",
            Code("TORCH_FR_DUMP_TEMP_FILE"), " location).")


def _unknown(v: Verdict, c: Culprit, r: int, op: str, seq: str, gone: str | None) -> Step:
    cause = f"rank {compress_ranks(c.waits_on)}" if c.waits_on else "the culprits above"
    return (f"Rank {r} left no readable dump, but its peers show it kept pace until {cause} stopped: it most "
            f"likely waits on {cause}, so start there. Then find out why rank {r}'s dump is missing or cut "
            "short (killed while writing, disk full: the node's logs, ", Code("dmesg"), ").")


def _straggler(v: Verdict, c: Culprit, r: int, op: str, seq: str, gone: str | None) -> Step:
    return (f"Nothing hangs, but rank {r} is consistently the last to enqueue. Profile it (", _py_spy(c, "top"),
            ", the torch profiler): data loading, CPU contention, thermal throttling or a slower host. A constant "
            "offset can also be clock skew between hosts: compare their clocks before blaming the rank.")


#: The runbook step of each culprit kind: (verdict, culprit, rank, op name, ``#seq``, why its process is gone).
_STEPS: dict[CulpritKind, Callable[[Verdict, Culprit, int, str, str, str | None], Step]] = {
    CulpritKind.NOT_ENQUEUED: _not_enqueued,
    CulpritKind.NOT_COMPLETED: _not_completed,
    CulpritKind.MISMATCH: _mismatch,
    CulpritKind.MISSING_DUMP: _missing_dump,
    CulpritKind.UNKNOWN: _unknown,
    CulpritKind.STRAGGLER: _straggler,
}
check_table("report.advice._STEPS", CulpritKind, _STEPS)


def next_step(v: Verdict, c: Culprit) -> Step:
    """The next step for culprit ``c``: where to look, with its real host and pid when known. A named cause
    (:mod:`fr_otel.diagnosis.cause`) says more than the culprit's kind: its step is the cause's."""
    if c.cause is not None and c.cause.cls not in _KIND_SAYS_IT:
        return _by_cause(c, c.cause)
    seq = f"#{c.collective_seq_id}" if c.collective_seq_id is not None else ""
    return _STEPS[c.kind](v, c, c.rank, op_name(c.op or "the collective"), seq, process_gone(v, c))


#: Causes the culprit's kind and the verdict's hosts already word best (a device stall under NCCL, a lost host):
#: their step stays the kind's.
_KIND_SAYS_IT = frozenset({CauseClass.UNKNOWN, CauseClass.DEVICE, CauseClass.HOST_LOST, CauseClass.SLOW_HOST})
#: Causes whose process still runs: its live stack is the next thing to read.
_LIVE_CAUSES = frozenset({CauseClass.PYTHON_BUSY, CauseClass.NATIVE_BUSY, CauseClass.SLEEPING, CauseClass.DATA_WAIT,
                          CauseClass.CHILD_WAIT, CauseClass.THREAD_WAIT, CauseClass.LOCK_WAIT, CauseClass.DEADLOCK,
                          CauseClass.MEMORY_PRESSURE, CauseClass.IO_WAIT, CauseClass.GIL_HELD})
#: ... and whose native frames say more than its Python ones.
_NATIVE_CAUSES = frozenset({CauseClass.GIL_HELD, CauseClass.NATIVE_BUSY})


def _by_cause(c: Culprit, cause: Cause) -> Step:
    """``Rank 2: waiting on its data pipeline. Look at ...`` with the command that goes with it."""
    first, rest = cause.info.next_step[:1].upper(), cause.info.next_step[1:]
    step: tuple[str, ...] = (f"Rank {c.rank}: {cause.info.label}. {first}{rest}.",)
    pid = c.process.pid if c.process is not None else None
    if cause.cls in _LIVE_CAUSES:
        native = " --native" if cause.cls in _NATIVE_CAUSES else ""
        step += (" While it is stuck: ", Code(_py_spy(c) + native), " (root or CAP_SYS_PTRACE).")
    elif cause.cls == CauseClass.STOPPED and pid is not None:
        step += (" On its host: ", Code(f"kill -CONT {pid}"), ".")
    elif cause.cls == CauseClass.OOM_KILLED:
        step += (" On its host: ", Code("dmesg -T | grep -i 'killed process'"), ".")
    return step


def general_next_step(v: Verdict) -> Step:
    """The next step when no rank is to blame (inconclusive, healthy)."""
    if v.verdict == VerdictWord.INCONCLUSIVE:
        again = ("The processes are gone: their logs and each host's kernel log (", Code("dmesg -T"),
                 ") are what is left. Next time, let every rank dump with its stacks before the job is killed."
                 ) if v.job_ended or "nccl" in v.backends else (
                 "Otherwise, dump every rank again (with stack traces) while the job is stuck.",)
        return ("Read the notes. When every member entered a collective and none completed it, the fault is "
                "inside the collective (device or network): check every host of that group (",
                Code("dmesg | grep -i xid"), ", DCGM health, NIC link errors, ", Code("NCCL_DEBUG=INFO"),
                " logs). ", *again)
    if v.verdict == VerdictWord.HEALTHY:
        return ("Nothing is stuck in the recorded collectives. If the job still hangs, it hangs outside them "
                "(point-to-point ops under gloo, a data loader, I/O): ", Code("py-spy dump"), " every rank.")
    return ("See the notes.",)
