"""Reading a rank's process from outside it: ``/proc`` state, CPU per thread, kernel wait, children, memory, OOM kills.

The agent inside a rank cannot speak for it when the rank is stopped, holds its GIL in native code or
has died; a sibling on the same host still reads ``/proc/<pid>`` of it without ptrace (same user):
the main thread's state (R, S, D, T, Z), every thread's CPU over a short sample (a thread at ~100 %
of a core is spinning), ``wchan`` (``pipe_read``, ``futex_wait_queue``...), and the OOM-kill counters
of its memory cgroup (v1 ``memory.oom_control``, v2 ``memory.events``) and of the host
(``/proc/vmstat``), as increases since this agent started; its main thread's child processes (pid, state,
command: what a ``subprocess.run`` waits on); its memory cgroup's use against its limit and how often it hit
the limit during the sample (a rank thrashing in reclaim); where py-spy is installed, a host-mate's Python
stacks read from outside without stopping it. Every read is a small file under /proc or
/sys, opened without blocking; a whole sample of a host's ranks takes :data:`SAMPLE_S` plus
microseconds, on the agent's incident thread, never the training thread. Facts, not verdicts: the
cause is named offline (:mod:`fr_otel.diagnosis.cause`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ...read.rank_facts import ChildFacts, ProcessFacts, ThreadFacts

__all__ = ["JOB_MARKERS", "SAMPLE_S", "OomBaseline", "is_rank_process", "recount_ooms", "sample_processes",
           "stack_frames"]

#: How long CPU time is measured over: long enough to tell a spinning thread (~1 core) from an idle one
#: (10 clock ticks at 100 Hz), short enough to end before the part that carries it is written.
SAMPLE_S = 0.1
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_MAX_THREADS_READ = 256
_MAX_THREADS_KEPT = 8
_MAX_CHILDREN = 8
_NO_LIMIT = 1 << 60  # v1 says "no limit" with a page-rounded 2**63-1
_PY_SPY_TIMEOUT_S = 5.0
_OUTSIDE_BUDGET_S = 8.0  # all py-spy reads of one sample together


def _read(path: str, limit: int = 4096) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat(path: str) -> tuple[str, str, int] | None:
    """(comm, state, utime+stime ticks) of ``/proc/.../stat``; None when unreadable."""
    text = _read(path)
    if not text or ")" not in text:
        return None
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    try:
        return head.partition("(")[2][:64], fields[0], int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def _threads(pid: int) -> dict[int, tuple[str, str, int]]:
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
    except OSError:
        return {}
    if len(tids) > _MAX_THREADS_READ:  # the main thread always (its tid need not be the lowest once pids wrap)
        tids = [pid, *(t for t in tids if t != pid)][:_MAX_THREADS_READ]
    out = {}
    for tid in tids:
        st = _stat(f"/proc/{pid}/task/{tid}/stat")
        if st is not None:
            out[tid] = st
    return out


def _timed_threads(pid: int) -> tuple[float, dict[int, tuple[str, str, int]]]:
    """When (the middle of the read, monotonic) and what :func:`_threads` read."""
    began = time.monotonic()
    read = _threads(pid)
    return (began + time.monotonic()) / 2, read


def _memory_cgroup(pid: int | str) -> str | None:
    """The folder of ``pid``'s memory cgroup (v1 ``memory`` controller, else the v2 unified one)."""
    text = _read(f"/proc/{pid}/cgroup")
    if not text:
        return None
    v1 = v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, path = parts[1], parts[2]
        if "memory" in controllers.split(","):
            v1 = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
        elif controllers == "":
            v2 = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
    for folder, name in ((v1, "memory.oom_control"), (v2, "memory.events")):
        if folder and os.path.exists(os.path.join(folder, name)):
            return folder
    return None


def _oom_count(folder: str | None) -> int | None:
    if folder is None:
        return None
    for name in ("memory.oom_control", "memory.events"):
        text = _read(os.path.join(folder, name))
        if text:
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
    return None


def _memory_count(folder: str | None) -> tuple[int, int, int] | None:
    """(usage, limit, times the limit was hit) of a memory cgroup with a limit (v1 ``memory.usage_in_bytes``,
    ``memory.limit_in_bytes``, ``memory.failcnt``; v2 ``memory.current``, ``memory.max``, ``memory.events`` max);
    None without a limit or when unreadable."""
    if folder is None:
        return None
    v1 = os.path.exists(os.path.join(folder, "memory.limit_in_bytes"))
    names = ("memory.usage_in_bytes", "memory.limit_in_bytes") if v1 else ("memory.current", "memory.max")
    raw = [(_read(os.path.join(folder, n)) or "").strip() for n in names]
    if not all(r.isdigit() for r in raw) or int(raw[1]) >= _NO_LIMIT:
        return None
    hits = None
    if v1:
        text = (_read(os.path.join(folder, "memory.failcnt")) or "").strip()
        hits = int(text) if text.isdigit() else None
    else:
        for line in (_read(os.path.join(folder, "memory.events")) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "max" and value.strip().isdigit():
                hits = int(value)
    return (int(raw[0]), int(raw[1]), hits) if hits is not None else None


def _children(pid: int) -> tuple[ChildFacts, ...]:
    """The main thread's child processes: pid, state, command line (``/proc/<pid>/task/<pid>/children``)."""
    text = _read(f"/proc/{pid}/task/{pid}/children") or ""
    out = []
    for child in text.split()[:_MAX_CHILDREN]:
        if not child.isdigit():
            continue
        st = _stat(f"/proc/{child}/stat")
        command = (_read(f"/proc/{child}/cmdline", 512) or "").replace("\0", " ").strip()
        out.append(ChildFacts(int(child), st[1] if st else "gone", (command or (st[0] if st else ""))[:200]))
    return tuple(out)


def _host_oom_count() -> int | None:
    text = _read("/proc/vmstat", 1 << 16)
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


@dataclass(slots=True)
class OomBaseline:
    """The OOM-kill counters when the agent started: an incident reports only kills since then."""

    host: int | None
    cgroups: dict[str, int]

    @classmethod
    def now(cls) -> OomBaseline:
        own = _memory_cgroup("self")
        count = _oom_count(own)
        return cls(_host_oom_count(), {own: count} if own is not None and count is not None else {})

    def since(self, folder: str | None) -> int | None:
        count = _oom_count(folder)
        if count is None or folder is None:
            return None
        return count - self.cgroups.get(folder, 0)


#: Variables a rank shares with its host-mates of the same job: a process lacking the reader's own values is not
#: one of this job's ranks, whatever a host record says.
JOB_MARKERS = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID", "FR_OTEL_JOB_ID")


def is_rank_process(pid: int, rank: int, own: Mapping[str, str] = os.environ) -> bool:
    """Whether ``pid`` is proven to be rank ``rank``'s process, before anything of it is read: this very process,
    or one whose environment says ``RANK=<rank>`` and carries the reader's (``own``) values of the job's
    :data:`JOB_MARKERS`. A pid a host record names may be a stale map's (reused since) or a forger's: a process
    not proven so, or whose environment cannot be read, is not read (its state, threads and stack would be
    blamed on the rank, and its command line exported). A pid no process has any more, or a zombie's (its
    environment is gone with its memory), is read: what is read then is only that it is gone."""
    if pid == os.getpid():
        return True
    text = _read(f"/proc/{pid}/environ", 1 << 18)
    if text is None:
        return not os.path.exists(f"/proc/{pid}")
    if not text:
        stat = _stat(f"/proc/{pid}/stat")
        return stat is not None and stat[1] == "Z"
    env = dict(item.partition("=")[::2] for item in text.split("\0") if "=" in item)
    if env.get("RANK") != str(rank):
        return False
    return all(env.get(name) == own[name] for name in JOB_MARKERS if own.get(name))


def sample_processes(pids: Mapping[int, int], me: int, baseline: OomBaseline, sample_s: float = SAMPLE_S,
                     outside_for: frozenset[int] = frozenset()) -> dict[int, ProcessFacts]:
    """rank -> what ``/proc`` says of its process ``pids[rank]``, CPU measured over ``sample_s``; ``me``: the
    reading rank. ``outside_for``: ranks whose Python stacks py-spy reads from outside, where installed (bounded). Ranks that share
    a process (simulated ranks, in tests and benches) share its one read."""
    by_pid: dict[int, int] = {}
    for rank, pid in sorted(pids.items()):
        by_pid.setdefault(pid, rank)
    if len(by_pid) < len(pids):
        read = sample_processes({r: p for p, r in by_pid.items()}, me, baseline, sample_s, outside_for)
        return {rank: read[by_pid[pid]] for rank, pid in pids.items() if by_pid[pid] in read}
    cgroups = {rank: _memory_cgroup(pid) for rank, pid in pids.items()}
    memory_before = {rank: _memory_count(cgroups[rank]) for rank in pids}
    before = {rank: _timed_threads(pid) for rank, pid in pids.items()}
    time.sleep(sample_s)
    after = {rank: _timed_threads(pid) for rank, pid in pids.items()}
    memory_after = {rank: _memory_count(cgroups[rank]) for rank in pids}
    host_now = _host_oom_count()
    host_since = host_now - baseline.host if host_now is not None and baseline.host is not None else None
    out: dict[int, ProcessFacts] = {}
    outside_until = time.monotonic() + _OUTSIDE_BUDGET_S
    for rank, pid in pids.items():
        # Each rank's own window, read to read: a reader descheduled between two ranks' reads (a busy host, in
        # the very incident) would otherwise divide one rank's ticks by too short a time.
        elapsed = max(after[rank][0] - before[rank][0], 1e-3)
        threads = []
        for tid, (name, state, ticks) in after[rank][1].items():
            was = before[rank][1].get(tid)
            cpu = (ticks - was[2]) / _TICK / elapsed if was is not None else 0.0
            threads.append(ThreadFacts(tid, name, state, max(cpu, 0.0), _wchan(pid, tid)))
        main = next((t for t in threads if t.tid == pid), None)
        if main is None:
            # Its cgroup went with it: the reader's own stands in (a pod's ranks share one).
            out[rank] = ProcessFacts(pid, "gone", oom_kills=baseline.since(_memory_cgroup("self")),
                                     host_oom_kills=host_since, sample_s=elapsed, sampled_ns=time.time_ns(),
                                     seen_by=me)
            continue
        threads.sort(key=lambda t: (-t.cpu, t.tid != pid, t.tid))
        kept = threads[:_MAX_THREADS_KEPT]
        if main not in kept:  # the main thread always stays: the cause is read from it
            kept = [*threads[:_MAX_THREADS_KEPT - 1], main]
        was_mem, mem = memory_before[rank], memory_after[rank]
        out[rank] = ProcessFacts(
            pid, main.state, sum(t.cpu for t in threads), main.wchan, tuple(kept),
            baseline.since(cgroups[rank]), host_since, elapsed, time.time_ns(), me,
            _outside_stack(pid, outside_until) if rank in outside_for and rank != me else "",
            _children(pid), mem[0] / mem[1] if mem and mem[1] else None,
            mem[2] - was_mem[2] if mem and was_mem else None)
    return out


def recount_ooms(facts: ProcessFacts, baseline: OomBaseline) -> ProcessFacts:
    """A gone process's OOM-kill counters read again now, as the incident concludes: a kill can land after the
    host's ranks were read (its peers' collective failure can raise the incident seconds before the kernel has
    counted it). Read on the process's own host only (``baseline`` is this reader's); the larger count stays."""
    if not facts.gone:
        return facts
    cgroup = baseline.since(_memory_cgroup("self"))  # its cgroup went with it: the reader's own stands in
    host_now = _host_oom_count()
    host = host_now - baseline.host if host_now is not None and baseline.host is not None else None

    def larger(a: int | None, b: int | None) -> int | None:
        return max(a, b) if a is not None and b is not None else a if b is None else b
    return replace(facts, oom_kills=larger(facts.oom_kills, cgroup), host_oom_kills=larger(facts.host_oom_kills, host))


def _wchan(pid: int, tid: int) -> str:
    text = _read(f"/proc/{pid}/task/{tid}/wchan", 128)
    return "" if not text or text.strip() == "0" else text.strip()[:64]


def _py_spy() -> str | None:
    """py-spy on PATH, else the one installed beside this interpreter (the ``py-spy`` extra in the job's venv)."""
    found = shutil.which("py-spy")
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return found or (beside if os.access(beside, os.X_OK) else None)


def _outside_stack(pid: int, until: float) -> str:
    """``py-spy dump --nonblocking`` of ``pid`` where py-spy is installed and ptrace is permitted, by ``until``; else
    "". Non-blocking: py-spy reads the process's memory without stopping it (a native stack would pause it, and
    a py-spy killed at its timeout can leave it stopped), so a rank still training is never slowed."""
    exe = _py_spy()
    left = min(_PY_SPY_TIMEOUT_S, until - time.monotonic())
    if exe is None or left <= 0.1:
        return ""
    try:
        done = subprocess.run([exe, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True,
                              errors="replace", timeout=left, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return stack_frames(done.stdout)[:4000] if done.returncode == 0 else ""


def stack_frames(dump: str) -> str:
    """The threads and frames of a ``py-spy dump``, without its header (``Process <pid>: <command line>``, the
    interpreter's path): a command line carries the process's arguments, tokens among them, never exported."""
    return "\n".join(line for line in dump.splitlines()
                     if not line.startswith(("Process ", "Python v")))
