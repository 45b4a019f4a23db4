"""A lab of N hosts on this machine: one network and UTS namespace per host, joined by a bridge.

Multi-node faults (a host whose link goes down, a frozen host, a host whose workers die, a slow
host) cannot happen on one host, so the lab makes hosts: host ``k`` is a network namespace with
its own ``lab0`` interface (a veth to a bridge in the root namespace), its own address in a
private /24 that exists only inside the lab, and its own hostname (``nodeK``: each process runs
under ``unshare --uts``). Names resolve inside the lab through ``/etc/netns/<ns>/hosts``; its
``resolv.conf`` points at the host's own loopback, so no lookup ever leaves it. With
``resolve_names=False`` a host's file names only itself: the other hosts' names do not resolve
there, as between many Kubernetes pods (a pod's hostname is no name the others can look up).

    with Lab(3, log_dir=tmp_path) as lab:
        job = lab.torchrun(TRAIN_LOOP, nproc_per_node=2, env=env)   # see support.lab_job
        job.wait_step(12)
        lab.partition(1)

A lab address is reachable only from inside the lab: :meth:`Lab.prometheus` runs a real
Prometheus on one host (it scrapes the others at their lab addresses) and answers the test's
queries through sockets made in that host's namespace (:meth:`Lab.connect`).

Everything the lab makes carries its name prefix ``frl<pid>x<seq>``; :meth:`Lab.close` (also
at exit, and in :func:`sweep_stale` for a lab whose pytest was killed) kills every process of
its namespaces by PID, then deletes namespaces, links, cgroups and hosts files. It needs root,
``ip`` and ``unshare``: :func:`lab_unavailable` says why not, in one line, for a skip.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from support.prometheus import PrometheusServer
from support.lab_cgroup import CpuLimit
from support.lab_ns import (
    NETNS_ETC,
    NETNS_RUN,
    LabError,
    connect_in,
    kill_namespace,
    kill_pids,
    lab_unavailable,
    link_names,
    netns_pids,
    process_gone,
    run_ip,
    start_time,
    sweep_stale,
)

if TYPE_CHECKING:
    from support.lab_job import LabJob

__all__ = ["IFACE", "Lab", "LabError", "LabProcess", "lab_unavailable", "sweep_stale"]

#: Every host's interface inside its namespace (what ``GLOO_SOCKET_IFNAME`` names).
IFACE = "lab0"
_SEQ = itertools.count()
_SEQ_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"


class LabProcess:
    """One process started on a lab host: its pid, log files, exit code and exit time."""

    def __init__(self, node: int, argv: Sequence[str], popen: subprocess.Popen[bytes], stdout: Path,
                 stderr: Path) -> None:
        self.node = node
        self.argv = list(argv)
        self.popen = popen
        self.stdout_path = stdout
        self.stderr_path = stderr
        self.started = time.time()
        #: Wall-clock time (``time.time()``) at which it exited, None while it runs.
        self.exit_time: float | None = None
        self._done = threading.Event()
        threading.Thread(target=self._reap, name=f"lab-wait-{popen.pid}", daemon=True).start()

    def _reap(self) -> None:
        self.popen.wait()
        self.exit_time = time.time()
        self._done.set()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """Exit status once it exited (negative: killed by that signal), else None."""
        return self.popen.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit status, or None if it still runs after ``timeout`` seconds (never raises)."""
        self._done.wait(timeout)
        return self.returncode

    def output(self) -> str:
        """What it printed so far: stdout, then stderr."""
        return "".join(p.read_text(errors="replace") for p in (self.stdout_path, self.stderr_path) if p.exists())


class Lab:
    """N hosts in network namespaces on a bridge; processes, torchrun jobs and faults on them."""

    def __init__(self, nodes: int = 3, *, hostnames: Sequence[str] | None = None, subnet: str = "10.213.0",
                 log_dir: str | os.PathLike[str] | None = None, resolve_names: bool = True) -> None:
        if not 1 <= nodes <= 99:
            raise ValueError(f"a lab has 1 to 99 nodes, not {nodes}")
        self.hostnames = list(hostnames) if hostnames is not None else [f"node{k}" for k in range(nodes)]
        if len(self.hostnames) != nodes:
            raise ValueError(f"{len(self.hostnames)} hostnames for {nodes} nodes")
        self.prefix = f"frl{os.getpid()}x{_SEQ_CHARS[next(_SEQ) % len(_SEQ_CHARS)]}"
        self.bridge = f"{self.prefix}b"
        self.namespaces = [f"{self.prefix}n{k}" for k in range(nodes)]
        self.veths = [f"{self.prefix}h{k}" for k in range(nodes)]  # host-side ends, on the bridge
        self.ips = [f"{subnet}.{k + 1}" for k in range(nodes)]
        #: False: each host's /etc/hosts names only itself (the others' names do not resolve there).
        self.resolve_names = resolve_names
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
        self.processes: list[LabProcess] = []
        self.jobs: list[LabJob] = []
        #: (time, what) for every fault injected, in order.
        self.faults: list[tuple[float, str]] = []
        self._limits: dict[int, CpuLimit] = {}
        self._seen: dict[int, int | None] = {}  # every pid the lab knew of, with its start time
        self._closed = False
        self._started = False

    @property
    def size(self) -> int:
        return len(self.namespaces)

    # -- making and removing the hosts ---------------------------------------------------------

    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Lab:
        """Sweep what killed earlier labs left, then make the bridge and every host."""
        if self._started:
            return self
        self._started = True
        reason = lab_unavailable()
        if reason:
            raise LabError(reason)
        sweep_stale()
        atexit.register(self.close)
        try:
            run_ip("link", "add", self.bridge, "type", "bridge")
            self._no_ipv6(self.bridge)
            run_ip("link", "set", self.bridge, "up")
            for k, ns in enumerate(self.namespaces):
                named = range(self.size) if self.resolve_names else [k]
                self._make_host(k, ns, "127.0.0.1 localhost\n" + "".join(
                    f"{self.ips[i]} {self.hostnames[i]}\n" for i in named))
        except BaseException:
            self.close()
            raise
        return self

    @staticmethod
    def _no_ipv6(link: str) -> None:
        Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6").write_text("1")

    def _make_host(self, k: int, ns: str, hosts: str) -> None:
        etc = NETNS_ETC / ns  # `ip netns exec` bind-mounts these over /etc/hosts and /etc/resolv.conf
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts)
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        run_ip("netns", "add", ns)
        run_ip("link", "add", self.veths[k], "type", "veth", "peer", "name", IFACE, "netns", ns)
        self._no_ipv6(self.veths[k])
        run_ip("link", "set", self.veths[k], "master", self.bridge, "up")
        inside = ("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1"
                  f" && ip addr add {self.ips[k]}/24 dev {IFACE} && ip link set {IFACE} up && ip link set lo up")
        run_ip("netns", "exec", ns, "sh", "-c", inside)

    def close(self) -> None:
        """Kill every process of the lab by PID, then delete namespaces, links, cgroups, hosts files."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for job in self.jobs:
            job.close()
        try:
            for ns in self.namespaces:
                self.track(netns_pids(ns))
                kill_namespace(ns)
            for proc in self.processes:  # one still being set up is not in its namespace yet
                if proc.returncode is None:
                    proc.popen.send_signal(signal.SIGKILL)  # Popen's own check: never a reused pid
            for ns in self.namespaces:
                kill_namespace(ns)
            for proc in self.processes:
                proc.wait(10)
        finally:
            for limit in self._limits.values():
                limit.remove()
            for ns in self.namespaces:
                run_ip("netns", "del", ns, check=False)
                shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
            for link in [*self.veths, self.bridge]:
                run_ip("link", "del", link, check=False)

    def leftovers(self) -> list[str]:
        """What of this lab still exists: namespaces, links, cgroups, hosts files, live processes."""
        names = run_ip("netns", "list").split()
        links = link_names()
        left = [f"namespace {ns}" for ns in self.namespaces if ns in names]
        left += [f"link {link}" for link in [*self.veths, self.bridge] if link in links]
        left += [f"hosts files {NETNS_ETC / ns}" for ns in self.namespaces if (NETNS_ETC / ns).exists()]
        left += [f"cgroup {limit.path}" for limit in self._limits.values() if limit.path.exists()]
        left += [f"process {pid}" for pid, start in sorted(self._seen.items()) if not process_gone(pid, start)]
        return left

    # -- processes -----------------------------------------------------------------------------

    def track(self, pids: Sequence[int]) -> None:
        """Remember these processes: :meth:`leftovers` reports any still alive after close."""
        for pid in pids:
            self._seen.setdefault(pid, start_time(pid))

    def spawn(self, node: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
              log_dir: str | os.PathLike[str] | None = None, *, name: str = "proc") -> LabProcess:
        """Run ``argv`` on host ``node`` (its namespace and hostname) in a new session.

        ``env`` is the whole environment (None: this process's). Output goes to
        ``<log_dir>/<hostname>.<name>.out`` and ``.err``.
        """
        if not self._started or self._closed:
            raise LabError("spawn needs an open lab (use it as a context manager)")
        folder = Path(log_dir) if log_dir is not None else self.log_dir
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / f"{self.hostnames[node]}.{name}.out"
        err = folder / f"{self.hostnames[node]}.{name}.err"
        wrapped = [*self.on_host(node), *argv]
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            popen = subprocess.Popen(wrapped, env=dict(env) if env is not None else None, stdout=stdout,
                                     stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True)
        proc = LabProcess(node, argv, popen, out, err)
        self.processes.append(proc)
        self.track([popen.pid])
        _wait_until_exec(popen, argv)
        return proc

    def on_host(self, node: int) -> list[str]:
        """The argv prefix that runs a command on host ``node``: its namespace, its hostname.

        ip netns exec, unshare and sh each exec the next: the pid is the command's own.
        """
        return ["ip", "netns", "exec", self.namespaces[node], "unshare", "--uts",
                "sh", "-c", 'hostname "$0" && exec "$@"', self.hostnames[node]]

    def connect(self, node: int, address: tuple[str, int], timeout: float = 10.0) -> socket.socket:
        """A TCP connection to ``address`` made from host ``node`` (``127.0.0.1`` is that host's)."""
        return connect_in(self.namespaces[node], address, timeout)

    def prometheus(self, node: int, targets: Sequence[str], **options: Any) -> PrometheusServer:
        """A real Prometheus on host ``node`` (not started): it scrapes ``targets`` at their lab
        addresses and answers the test through :meth:`connect`; ``options`` as PrometheusServer's.
        The lab's close kills it with the host's other processes if the test did not stop it."""
        return PrometheusServer(targets, command_prefix=self.on_host(node),
                                connect=lambda address, timeout: self.connect(node, address, timeout), **options)

    def torchrun(self, script: str | os.PathLike[str], nproc_per_node: int, env: Mapping[str, str],
                 **options: object) -> LabJob:
        """torchrun on every host with a static rendezvous on node0; see :func:`support.lab_job.start_job`."""
        from support.lab_job import start_job

        job = start_job(self, script, nproc_per_node, env, **options)  # type: ignore[arg-type]
        self.jobs.append(job)
        return job

    def pids(self, node: int) -> list[int]:
        """Every live process of host ``node``, by its network namespace."""
        pids = netns_pids(self.namespaces[node])
        self.track(pids)
        return pids

    def node_of(self, pid: int) -> int | None:
        """The host a process runs on (by its network namespace), None if gone or not in the lab."""
        try:
            inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            return None
        for k, ns in enumerate(self.namespaces):
            try:
                if os.stat(NETNS_RUN / ns).st_ino == inode:
                    return k
            except OSError:
                continue
        return None

    # -- faults --------------------------------------------------------------------------------

    def _fault(self, what: str) -> float:
        now = time.time()
        self.faults.append((now, what))
        return now

    def partition(self, node: int) -> float:
        """Take host ``node``'s link down at the bridge: its packets vanish, nobody gets a TCP reset.

        Partitioning node0 is "the store's host lost". Returns the fault's time.
        """
        run_ip("link", "set", self.veths[node], "down")
        return self._fault(f"partition {self.hostnames[node]}")

    def heal(self, node: int) -> float:
        """Bring host ``node``'s link back up."""
        run_ip("link", "set", self.veths[node], "up")
        return self._fault(f"heal {self.hostnames[node]}")

    def freeze(self, node: int) -> float:
        """SIGSTOP every process of host ``node`` (until :meth:`thaw` or close)."""
        t = self._fault(f"freeze {self.hostnames[node]}")
        stopped: set[int] = set()
        deadline = time.monotonic() + 5
        while True:  # again, for any process forked meanwhile, until every one shows stopped
            running = [p for p in self.pids(node) if p not in stopped or process_state(p) not in ("T", "t", "Z", "")]
            if not running or time.monotonic() > deadline:
                return t
            kill_pids(sorted(running), signal.SIGSTOP)
            stopped |= set(running)
            time.sleep(0.01)

    def thaw(self, node: int) -> float:
        """SIGCONT every process of host ``node``."""
        kill_pids(self.pids(node), signal.SIGCONT)
        return self._fault(f"thaw {self.hostnames[node]}")

    def crash_workers(self, node: int) -> list[int]:
        """SIGKILL the training workers (by their ``pid_rank_<r>`` markers) of every job on host ``node``."""
        pids = [pid for job in self.jobs for pid in job.worker_pids().values() if self.node_of(pid) == node]
        self._fault(f"crash workers {pids} of {self.hostnames[node]}")
        kill_pids(pids, signal.SIGKILL)
        return pids

    def crash(self, node: int) -> float:
        """SIGKILL every process of host ``node``, its torchrun too: the host crashed (nothing of it
        outlives the fault, unlike :meth:`crash_workers`). Returns the fault's time."""
        self.pids(node)  # tracked: leftovers() names any that survive
        t = self._fault(f"crash {self.hostnames[node]}")
        kill_namespace(self.namespaces[node])
        return t

    def slow(self, node: int, cpu_fraction: float) -> str:
        """Hold host ``node``'s processes (together, children too) to ``cpu_fraction`` of one CPU.

        A cgroup ``cpu.max`` (v2) or ``cpu.cfs_quota_us`` (v1, where the cpu controller is
        mounted there instead); returns which file was written. LabError where neither works.
        """
        if node not in self._limits:
            self._limits[node] = CpuLimit.create(self.namespaces[node])
        written = self._limits[node].set(cpu_fraction, self.pids(node))
        self._fault(f"slow {self.hostnames[node]} to {cpu_fraction:g} CPU ({written})")
        return written


def _wait_until_exec(popen: subprocess.Popen[bytes], argv: Sequence[str], timeout: float = 60.0) -> None:
    """Return once ``popen`` runs ``argv`` (or whatever it exec'd since, or ended), no longer a wrapper before it: sh (dash) runs
    ``hostname`` through vfork, and a host frozen between that vfork and its exec leaves sh in the
    uninterruptible vfork wait (state D) until the thaw, never stopped (seen: a freeze check failed on it)."""
    wrappers = (b"ip\0netns\0exec\0", b"unshare\0", b"sh\0-c\0hostname ")  # :meth:`Lab.on_host`'s, in turn
    deadline = time.monotonic() + timeout
    while popen.poll() is None and time.monotonic() < deadline:
        try:
            cmdline = Path(f"/proc/{popen.pid}/cmdline").read_bytes()
        except OSError:
            return
        if cmdline and not cmdline.startswith(wrappers):  # the command itself (or what it exec'd since)
            return
        if not cmdline and process_name(popen.pid) not in ("ip", "unshare", "sh", ""):
            return  # no argv to read (a zombie, or one that cleared it): its name says it left the wrappers
        # An empty cmdline is read mid-execve too: not yet the command.
        time.sleep(0.005)
    if popen.poll() is None:
        raise LabError(f"{list(argv)[:3]} still in its host's wrappers {timeout:g} s after it was started")


def process_name(pid: int) -> str:
    """A process's command name (``/proc/<pid>/comm``), or "" once it is gone: ``ip`` until ``ip netns exec``
    has entered the namespace, mounted its /sys and exec'd the program."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def process_state(pid: int) -> str:
    """A process's state letter (R, S, T, Z...), or "" once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]
