"""What a lab makes, found by name and PID: namespaces, links, processes; and the sweep of dead labs.

Every name a :class:`support.lab.Lab` makes starts ``frl<pid>x<seq>`` (the pid of the process
that made it), so a lab whose process died without cleaning up (SIGKILL, a crashed pytest) is
recognised and removed by the next one, and a live lab of another process is never touched.
Processes are only ever signalled by PID: those of a namespace (``ip netns pids``), never by name.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from support.lab_cgroup import stale_cpu_limits

__all__ = ["NETNS_ETC", "NETNS_RUN", "LabError", "connect_in", "kill_namespace", "kill_pids", "lab_unavailable",
           "link_names", "netns_pids", "owner_gone", "process_gone", "run_ip", "start_time", "sweep_stale"]

NETNS_RUN = Path("/run/netns")
NETNS_ETC = Path("/etc/netns")
_OWNED = re.compile(r"^frl(\d+)x[0-9a-z]")


class LabError(RuntimeError):
    """A lab step failed (the command and what it said)."""


def run_ip(*args: str, check: bool = True) -> str:
    """``ip ARGS``: its stdout, or LabError with what it said."""
    argv = ["ip", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return proc.stdout


def lab_unavailable() -> str | None:
    """Why a lab cannot run here (one line, for ``pytest.skip``), or None when it can."""
    if os.geteuid() != 0:
        return "the multi-host lab needs root (network namespaces, veths, a bridge)"
    missing = [tool for tool in ("ip", "unshare", "sh", "hostname") if shutil.which(tool) is None]
    if missing:
        return f"the multi-host lab needs {', '.join(missing)} on PATH"
    probe = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True, timeout=30,
                           check=False)
    if probe.returncode != 0:
        return f"the multi-host lab cannot make namespaces here: {probe.stderr.strip() or probe.returncode}"
    return None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (pid reuse check), None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in "ZX" else int(fields[19])


def process_gone(pid: int, start: int | None) -> bool:
    """True once the process that had ``start`` as start time has exited (a zombie counts as exited)."""
    now = start_time(pid)
    return now is None or (start is not None and now != start)


def kill_pids(pids: Sequence[int], sig: signal.Signals) -> None:
    """Signal each pid; one already gone is skipped."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


_CLONE_NEWNET = 0x40000000


def connect_in(ns: str, address: tuple[str, int], timeout: float) -> socket.socket:
    """A TCP connection made from inside network namespace ``ns`` (its ``127.0.0.1`` is its own).

    A socket belongs to the namespace it was created in, whichever thread uses it later: a
    throw-away thread enters ``ns`` (setns(2), per thread; Python 3.11 has no os.setns), makes
    and connects the socket, and ends, so no thread of the caller ever changes namespace.
    """
    made: list[socket.socket | OSError | LabError] = []

    def inside() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(NETNS_RUN / ns, os.O_RDONLY)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise LabError(f"setns into {ns}: {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
            made.append(socket.create_connection(address, timeout))
        except (OSError, LabError) as exc:  # handed to the caller
            made.append(exc)

    thread = threading.Thread(target=inside, name=f"lab-connect-{ns}", daemon=True)
    thread.start()
    thread.join()
    if not made:
        raise LabError(f"connecting to {address} from {ns} failed (see the thread's traceback)")
    if isinstance(made[0], (OSError, LabError)):
        raise made[0]
    return made[0]


def netns_pids(ns: str) -> list[int]:
    """Every process whose network namespace is ``ns`` ([] once it is gone)."""
    try:
        return [int(p) for p in run_ip("netns", "pids", ns).split()]
    except LabError:
        return []  # the namespace is already gone


def kill_namespace(ns: str, timeout: float = 10.0) -> list[int]:
    """SIGCONT then SIGKILL every process of ``ns`` until none is left; returns any survivors."""
    deadline = time.monotonic() + timeout
    while True:
        pids = netns_pids(ns)
        if not pids or time.monotonic() > deadline:
            return pids
        kill_pids(pids, signal.SIGCONT)  # a frozen process dies on SIGKILL too, but never leave one stopped
        kill_pids(pids, signal.SIGKILL)
        time.sleep(0.05)


def link_names() -> set[str]:
    """Every network interface of the root namespace."""
    return {line.split(":")[1].strip().split("@")[0] for line in run_ip("-o", "link", "show").splitlines()}


def owner_gone(name: str) -> bool:
    """True for a lab name (``frl<pid>x...``) whose process is gone."""
    match = _OWNED.match(name)
    if match is None:
        return False
    return start_time(int(match.group(1))) is None  # gone, or a zombie nobody reaped yet


def sweep_stale() -> list[str]:
    """Remove what labs of dead processes left (their processes, namespaces, links, cgroups); returns it."""
    removed: list[str] = []
    for ns in run_ip("netns", "list", check=False).split():
        if owner_gone(ns):
            kill_namespace(ns)
            run_ip("netns", "del", ns, check=False)
            removed.append(f"namespace {ns}")
    if NETNS_ETC.is_dir():
        for folder in NETNS_ETC.iterdir():
            if owner_gone(folder.name):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(f"hosts files {folder}")
    for link in sorted(link_names()):
        if owner_gone(link):
            run_ip("link", "del", link, check=False)
            removed.append(f"link {link}")
    for limit in stale_cpu_limits(owner_gone):
        limit.remove()
        removed.append(f"cgroup {limit.path}")
    return removed
