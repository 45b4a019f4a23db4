"""Why a culprit stopped: one cause class per culprit, with the evidence lines it rests on.

The verdict says *who* (the culprit) and *where* (its group, collective, step, live frame); this says
*why*, from what is known of the culprit beyond the recorder: how it left (its exit record: an uncaught
exception, SIGTERM, a normal exit), what its host read of its process in ``/proc`` (state, CPU, kernel
wait, OOM kills: :mod:`fr_otel.read.rank_facts`), its main thread's live frames, the hosts the verdict
found lost, and the other culprits (a slow host slows them all). The classes, their labels, the evidence
each needs and the next step are one table (:mod:`.cause_kinds`). The first rule that holds names the class;
with nothing to go on the class is ``unknown``, said as such. Light: no torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..read.frame import is_user_frame
from ..read.live_stack import LiveStacks, ThreadStack
from ..read.rank_facts import ExitRecord, ProcessFacts
from .cause_kinds import Cause, CauseClass, Domain
from .hosts import LOST_STATES, HostFinding
from .kinds import CulpritKind
from .verdict import Culprit

__all__ = ["find_cause", "with_causes"]


_DATA = re.compile(r"torch/utils/data/|dataloader", re.IGNORECASE)
_ACQUIRE = re.compile(r"(?:^|\.)acquire$")
_LOCK_CALL = re.compile(r"(?:^|\.)acquire$")
_THREAD_FILE = re.compile(r"(?:^|/)queue\.py$|concurrent/futures/")
_THREAD_CALL = re.compile(r"(?:^|\.)join$")
_CHILD_FILE = re.compile(r"(?:^|/)subprocess\.py$|multiprocessing/(?:pool|popen_\w+|process)\.py$")
_CHILD_CALL = re.compile(r"(?:^|\.)(?:waitpid|wait3|wait4|waitid)$")
_CHILD_WCHAN = re.compile(r"^(?:do_wait|kernel_wait4?|__do_sys_wait4)$")
_NATIVE_LIB = re.compile(r"/(?:torch|numpy|scipy)/")
_IO_CALL = re.compile(r"(?:^|\.)(?:read|readline|readlines|readinto|recv|recv_into|recvfrom|accept|select|poll|"
                      r"open|connect|sendall|write|fsync|flush|communicate)$")
_IO_WCHAN = re.compile(r"pipe|fifo|wait_for_partner|sock|tcp|unix|poll|select|nfs|fuse|wait_on_page|io_schedule|blk|ext4|xfs")
_CALLS = re.compile(r"[A-Za-z_][\w.]*\s*\(")
_SLEEP_CALL = re.compile(r"(?:^|\.)sleep$")
_BUSY_CPU = 0.5  # cores: a process this busy is computing, not waiting
_IDLE_CPU = 0.1  # cores: a main thread this idle is asleep, whatever its frame
_FULL = 0.95  # of its memory cgroup's limit: at it
_STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O", "T": "stopped", "t": "stopped (traced)",
           "Z": "a zombie (exited, not yet waited for)", "gone": "gone"}
#: An exception that names the hardware (CUDA's and NCCL's words for a failing GPU or link): no code fault.
_HARDWARE = re.compile(r"uncorrectable ECC|ECC error|fallen off the bus|\bXid\b|NVLink error|unhandled system error",
                       re.IGNORECASE)


def with_causes(culprits: Sequence[Culprit], job_facts: Mapping[int, ProcessFacts], exits: Mapping[int, ExitRecord],
                hosts: Sequence[HostFinding]) -> list[Culprit]:
    """``culprits`` with their cause (reported-only ranks included: their state is worth saying too)."""
    lost = {h.host for h in hosts if h.state in LOST_STATES}  # not "unreachable": a view from here, no culprit
    stragglers = [c for c in culprits if c.kind == CulpritKind.STRAGGLER]
    return [replace(c, cause=find_cause(c, job_facts.get(c.rank), exits.get(c.rank), lost, stragglers))
            for c in culprits]


def find_cause(culprit: Culprit, facts: ProcessFacts | None, leaving: ExitRecord | None, lost_hosts: set[str],
               stragglers: Sequence[Culprit] = ()) -> Cause:
    """The first rule that holds, from the strongest evidence (the host gone, the process gone) to the weakest.
    How a rank left decides only when it left on its own (its code raised, or it exited): SIGTERM and a
    collective's failure are what a hang ends in (torchrun's teardown, a watchdog), so they are evidence
    beside the cause the other rules find."""
    place = culprit.node or culprit.host
    seen = [_proc_line(facts)] if facts is not None else []
    if place and place in lost_hosts:
        return Cause(CauseClass.HOST_LOST, (f"the verdict found its host {place} lost or cut off",))
    if culprit.kind == CulpritKind.MISMATCH:  # what it did after (an exception, a teardown) follows from it
        return Cause(CauseClass.CODE_DIVERGENCE, (culprit.evidence[:400], *seen))
    if leaving is not None and leaving.how == "exception":
        where = f" at {leaving.where}" if leaving.where else ""
        hardware = _HARDWARE.search(f"{leaving.type} {leaving.message}")  # the machine's word, not the code's
        return Cause(CauseClass.CRASHED, (f"uncaught {leaving.type or 'exception'}: {leaving.message}{where}",),
                     None if hardware else Domain.SOFTWARE)
    if leaving is not None and leaving.how == "exit":
        return Cause(CauseClass.EXITED, ("it left the interpreter (its script returned or called sys.exit) while its "
                                         "peers still wait",))
    after = [_aftermath(leaving)] if leaving is not None else []
    if facts is not None and facts.gone and leaving is None:
        kills = facts.oom_kills if facts.oom_kills is not None else facts.host_oom_kills
        if kills:
            own = facts.oom_kills is not None  # the job's own memory limit, else the host's kernel (whose use?)
            where = "its memory cgroup" if own else "its host (/proc/vmstat)"
            return Cause(CauseClass.OOM_KILLED, (f"its process {facts.pid} is gone without an exit record",
                                                 f"{where} counted {kills} OOM kill(s) since its agents started"),
                         None if own else Domain.UNKNOWN)
        return Cause(CauseClass.CRASHED, (f"its process {facts.pid} is gone without an exit record: a signal "
                                          "(SIGKILL, SIGSEGV) or os._exit ended it", *seen))
    if facts is not None and facts.state in ("T", "t"):
        return Cause(CauseClass.STOPPED, (*seen, *after))
    if culprit.kind == CulpritKind.STRAGGLER:
        mates = sorted(s.rank for s in stragglers if s.rank != culprit.rank and (s.node or s.host) == place and place)
        if mates:
            return Cause(CauseClass.SLOW_HOST, (f"rank(s) {', '.join(map(str, mates))} of its host {place} are late "
                                                "too", *seen))
    if culprit.kind == CulpritKind.NOT_COMPLETED:
        return Cause(CauseClass.DEVICE, ("it entered the collective and never completed it", *seen, *after))
    now = culprit.now
    held = Domain.UNKNOWN if facts is not None and facts.state == "D" else None  # uninterruptible: whose, unknown
    if now is not None and now.main is not None:
        found = _from_stack(culprit, now, facts)
        if found is not None:
            return replace(found, evidence=(*found.evidence, *seen, *after),
                           evidence_domain=held if found.cls == CauseClass.IO_WAIT else found.evidence_domain)
    pressed = _memory_pressure(facts) if now is None else ""
    if pressed:  # a rank thrashing at its limit can be too slow to send its part: no GIL held, no storage at fault
        return Cause(CauseClass.MEMORY_PRESSURE, (pressed, *seen, *after))
    if held is not None:
        return Cause(CauseClass.IO_WAIT, (*seen, *after), held)
    silent = culprit.kind == CulpritKind.MISSING_DUMP or culprit.record is not None  # its own agent sent nothing
    if facts is not None and not facts.gone and now is None and silent:
        return Cause(CauseClass.GIL_HELD, (
            "its own agent sent nothing within the incident's budget while its process is alive and not stopped: "
            "none of its Python threads ran", *seen,
            *([f"Python stack read from outside (py-spy): {_stack_top(facts.outside_stack)}"]
              if facts.outside_stack else []), *after))
    if leaving is not None and leaving.how == "sigterm":
        return Cause(CauseClass.CRASHED, (*after, *seen))
    return Cause(CauseClass.UNKNOWN, (*seen, *after))


def _aftermath(leaving: ExitRecord) -> str:
    if leaving.how == "sigterm":
        return "then SIGTERM ended it (its launcher or the scheduler stopping the job)"
    return f"then a collective failed on it ({leaving.type}: {leaving.message})"[:400]


def _from_stack(culprit: Culprit, now: LiveStacks, facts: ProcessFacts | None) -> Cause | None:
    """The class its main thread's live stack names (with its kernel wait and CPU), in the table's order; None inside
    a collective its peers wait in too."""
    main = now.main
    assert main is not None
    doing, where = now.doing, now.where
    at = f"main thread in {doing or '?'}" + (f" at {where.filename}:{where.line} in {where.name}" if where else "")
    if main.code and not _CALLS.search(main.code):
        at += f" ({main.code.strip()[:120]})"  # a line with no call (``with b:``): the line says more than its function
    if now.in_collective:
        if culprit.kind == CulpritKind.NOT_COMPLETED:
            return Cause(CauseClass.DEVICE, (f"{at}: inside the collective, which every member entered",))
        return None
    wchan = facts.wchan if facts is not None else ""
    if any(_DATA.search(f.filename) or _DATA.search(f.name) for f in main.frames):
        return Cause(CauseClass.DATA_WAIT, (at + " (the DataLoader)",))
    if any(_CHILD_FILE.search(f.filename) for f in main.frames) or _CHILD_CALL.search(doing) or _CHILD_WCHAN.search(
            wchan):
        kids = [f"child process {k.pid} ({k.command or '?'}): {_STATES.get(k.state, k.state)}"
                for k in (facts.children if facts is not None else ())[:3]]
        return Cause(CauseClass.CHILD_WAIT, (at, *(kids or ["no child process of its main thread was found"])))
    futex = "futex" in wchan  # the main thread's kernel wait
    if _waits_on_thread(main, doing):
        return Cause(CauseClass.THREAD_WAIT, (at, *_other_threads(now)))
    if _waits_on_lock(main, doing, futex):
        # A deadlock needs two threads each in a lock's acquire: a thread idle in a condition or a queue (a
        # pin-memory thread, tqdm's monitor, a pool's workers) waits for work, not for the main thread.
        others = [t for t in now.threads[1:] if _acquires(t, _thread_doing(t), futex)]
        # The waiting thread's CPU, not the process's: the agent's own threads work hardest in the very incident.
        cpu, whose = _main_cpu(facts)
        if others and (cpu is None or cpu < _BUSY_CPU) and _acquires(main, doing, futex):
            o = others[0]
            f = o.frames[0]
            off = (f"{whose} used {cpu:.2f} CPU cores over {facts.sample_s:.1f} s" if cpu is not None and facts
                   else "its CPU was not read")
            return Cause(CauseClass.DEADLOCK, (at, f"thread {o.name} waits too, in {_thread_doing(o) or f.name} at "
                                               f"{f.filename}:{f.line} in {f.name}", off))
        return Cause(CauseClass.LOCK_WAIT, (at,))
    cpu, whose = _main_cpu(facts)
    used = f"{whose} used {cpu:.2f} CPU cores over {facts.sample_s:.1f} s" if cpu is not None and facts else ""
    if _in_event_wait(main) and now.dead:  # the thread that would set it is dead
        return Cause(CauseClass.THREAD_WAIT, (at, *_other_threads(now)))
    asleep = (at, *([used] if used else []), *([f"kernel wait {wchan}"] if wchan else []))
    if _SLEEP_CALL.search(doing) or _in_event_wait(main):
        return Cause(CauseClass.SLEEPING, asleep)
    pressed = _memory_pressure(facts)
    if pressed:  # an I/O wait while its cgroup reclaims at its limit is the memory's doing (page cache thrash)
        return Cause(CauseClass.MEMORY_PRESSURE, (pressed, at))
    if _IO_CALL.search(doing) or _IO_WCHAN.search(wchan):
        return Cause(CauseClass.IO_WAIT, (at,))
    if facts is not None and facts.state == "S" and cpu is not None and cpu < _IDLE_CPU and wchan \
            and "futex" not in wchan:
        # Asleep in the kernel, off the CPU, in no wait named above: asleep in native code. A thread that is runnable
        # (R) on a box busier than its cores gets little CPU, and one in a futex may be waiting for its own GIL back
        # from the agent's threads: neither is asleep.
        return Cause(CauseClass.SLEEPING, asleep)
    if _in_native_call(main):
        if facts is not None and facts.state == "S" and cpu is not None and cpu < _IDLE_CPU:  # asleep, not busy
            return Cause(CauseClass.SLEEPING, (*asleep, "asleep inside that call (no Python frame below it)"))
        return Cause(CauseClass.NATIVE_BUSY, (at, *([used] if used else []),
                                              "no Python frame below that call: the time goes to native code"))
    return Cause(CauseClass.PYTHON_BUSY, (at, *([used] if used else [])))


def _main_cpu(facts: ProcessFacts | None) -> tuple[float | None, str]:
    """The main thread's CPU (else the process's) in cores, and whose it is."""
    main_now = facts.main_thread if facts is not None else None
    return ((main_now.cpu, "its main thread") if main_now is not None else
            (facts.cpu, "its process") if facts is not None else (None, ""))


def _memory_pressure(facts: ProcessFacts | None) -> str:
    """At its memory cgroup's limit and reclaiming to stay under it: the evidence line, else ""."""
    if facts is None or facts.gone or facts.memory_use is None or facts.memory_use < _FULL \
            or not facts.memory_limit_hits:
        return ""
    return (f"its memory cgroup is at {facts.memory_use:.1%} of its limit and hit it {facts.memory_limit_hits} time(s) "
            f"in {facts.sample_s:.1f} s (reclaiming to stay under it)")


def _waits_on_thread(t: ThreadStack, doing: str) -> bool:
    """In a queue's get/put, a thread's join or a future's result: waiting on another thread of its process."""
    return any(_THREAD_FILE.search(f.filename) for f in t.frames) or bool(_THREAD_CALL.search(doing)) or (
        bool(t.frames) and t.frames[0].filename.endswith("threading.py")
        and t.frames[0].name in ("join", "_wait_for_tstate_lock"))


def _in_event_wait(t: ThreadStack) -> bool:
    """In an Event's or Condition's wait (threading.py), nothing else above it in the library."""
    return bool(t.frames) and t.frames[0].filename.endswith("threading.py") and t.frames[0].name == "wait"


def _in_native_call(t: ThreadStack) -> bool:
    """The innermost frame is the user's own line and calls something (a Python callee would be a frame below it), or
    the innermost frame is in a native library's Python wrapper (torch, numpy)."""
    if not t.frames:
        return False
    top = t.frames[0]
    if _NATIVE_LIB.search(top.filename):
        return True
    return is_user_frame(top.filename) and bool(t.code) and bool(_CALLS.search(t.code) or "@" in t.code)


def _other_threads(now: LiveStacks) -> list[str]:
    """What the main thread's other threads are doing, and which died of what: the one it waits on is among them."""
    lines = [d.sentence() for d in now.dead[-3:]]
    for t in now.threads[1:4]:
        f = t.frames[0]
        lines.append(f"thread {t.name} in {_thread_doing(t) or f.name} at {f.filename}:{f.line} in {f.name}")
    return lines or ["no other thread of its process is alive"]


def _thread_doing(t: ThreadStack) -> str:
    call = _CALLS.search(t.code) if t.code else None
    return call.group(0).rstrip("( ") if call else (t.frames[0].name if t.frames else "")


def _acquires(t: ThreadStack, doing: str, futex: bool) -> bool:
    """In a lock's acquire: the call says so, or a ``with`` line while the main thread waits on a futex (what a
    blocked ``threading.Lock`` is in the kernel)."""
    if _ACQUIRE.search(doing):
        return True
    return t.code.lstrip().startswith("with ") and (futex or "lock" in t.code.lower())


def _waits_on_lock(t: ThreadStack, doing: str, futex: bool) -> bool:
    """In a lock's acquire."""
    if _LOCK_CALL.search(doing) or _acquires(t, doing, futex):
        return True
    return bool(t.frames) and t.frames[0].filename.endswith("threading.py") and t.frames[0].name == "acquire"


def _stack_top(dump: str, frames: int = 5) -> str:
    """The main thread's innermost frames of a ``py-spy dump``: ``match (re/__init__.py:166) < ...``."""
    lines = dump.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Thread ") and "MainThread" in line), None)
    if start is None:
        start = next((i for i, line in enumerate(lines) if line.startswith("Thread ")), -1)
    top = []
    for line in lines[start + 1:]:
        if not line.startswith(" "):
            break
        top.append(line.strip())
    held = " (it holds the GIL)" if start >= 0 and "+gil" in lines[start] else ""
    return (" < ".join(top[:frames]) or "(empty)") + held


def _proc_line(facts: ProcessFacts) -> str:
    states = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O", "T": "stopped", "t": "stopped (traced)",
              "Z": "a zombie", "gone": "gone"}
    if facts.gone:
        return f"/proc/{facts.pid}: gone"
    busiest = facts.threads[0] if facts.threads else None
    text = (f"/proc/{facts.pid}: {states.get(facts.state, facts.state)}, {facts.cpu:.2f} CPU cores over "
            f"{facts.sample_s:.1f} s")
    if busiest is not None and busiest.cpu >= _BUSY_CPU:
        text += f" (thread {busiest.name} {busiest.cpu:.2f})"
    if facts.wchan:
        text += f", kernel wait {facts.wchan}"
    return text + (f" (read by rank {facts.seen_by})" if facts.seen_by is not None else "")
