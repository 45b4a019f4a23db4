"""The demo's training job: ``fr-otel run`` around torchrun around the stalled-loader script,
watched from outside as a user would watch it (its files, its ``/metrics``), then stopped by pid.

torchrun starts each worker in a session of its own, so ending the launcher's session would
leave the workers running: they are found first (the launcher's children, and the pids the
incident's ``ranks.json`` names, each checked to run the demo's script), asked to stop
(SIGTERM, on which the agent flushes), killed if they have not, and only then is the launcher's
session ended.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ..common.ports import free_port_block, ports_free
from ..incident.files import INCIDENT_FILE, REPORT_FILE
from ..read.rank_map import RANKS_FILE, read_rank_map
from ..scenarios import stalled_loader
from ..scenarios.job import gloo_on_loopback

__all__ = ["DEFAULT_METRICS_PORT", "DemoFailed", "DemoJob", "DemoPlan", "TorchMissing", "metrics_base"]

DEFAULT_METRICS_PORT = 9740  # the agent's own default; the demo moves off it only when it is taken
SCRIPT = Path(stalled_loader.__file__).resolve()
_POLL_S = 0.2
_STOP_GRACE_S = 5.0


class TorchMissing(RuntimeError):
    """The demo runs a real torch job: it needs the ``fr-otel[torch]`` extra."""


class DemoFailed(RuntimeError):
    """The job did not get as far as the demo needs (the message is one line; the job's log says more)."""


@dataclass(frozen=True)
class DemoPlan:
    """What the demo's job does and where it writes: one rank's loader stalls at a known step."""

    out: Path  # the job's --out: dumps/<trace id>/, the trace file, job.log
    metrics_port: int  # base port: rank r serves 127.0.0.1:(base + r) (one host: local rank = rank)
    world_size: int = 4
    stall_rank: int = 2
    stall_step: int = 5
    stall_seconds: float = 5.0  # the agent's threshold, lowered from 60 s so the demo is quick
    export_flags: tuple[str, ...] = ()  # --endpoint/--protocol for fr-otel run
    export_env: Mapping[str, str] = field(default_factory=dict)  # the other OTEL_EXPORTER_OTLP_TRACES_* settings
    timeout_s: float = 150.0  # from start to the incident's files, on a loaded 2-core machine

    @property
    def dumps(self) -> Path:
        return self.out / "dumps"

    @property
    def log(self) -> Path:
        return self.out / "job.log"

    def urls(self) -> dict[int, str]:
        """Each rank's /metrics."""
        return {r: f"http://127.0.0.1:{self.metrics_port + r}/metrics" for r in range(self.world_size)}

    def run_flags(self) -> list[str]:
        """``fr-otel run``'s flags: the agent's settings for the demo."""
        return ["--stall-seconds", f"{self.stall_seconds:g}", "--metrics-port", str(self.metrics_port),
                "--metrics-addr", "127.0.0.1", "--out", str(self.out), "--dump-dir", str(self.dumps),
                *self.export_flags]

    def job_args(self) -> list[str]:
        return [str(SCRIPT), "--stall-rank", str(self.stall_rank), "--stall-step", str(self.stall_step)]

    def command(self) -> list[str]:
        """What runs: this interpreter's fr-otel and torchrun (so no PATH is needed)."""
        return [sys.executable, "-m", "fr_otel.cli", "run", *self.run_flags(), "--",
                sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                str(self.world_size), *self.job_args()]

    def shown(self) -> str:
        """The same command as a user types it."""
        return shlex.join(["fr-otel", "run", *self.run_flags(), "--", "torchrun", "--standalone",
                           "--nproc-per-node", str(self.world_size), *self.job_args()])


def metrics_base(world_size: int, wanted: int | None = None) -> int:
    """``wanted`` when given; else the agent's default 9740 when its block is free, else any free block."""
    if wanted is not None:
        return wanted
    if ports_free(DEFAULT_METRICS_PORT, world_size, reuse_address=True):
        return DEFAULT_METRICS_PORT
    return free_port_block(world_size)


class DemoJob:
    """The running job; a context manager that always stops it."""

    def __init__(self, plan: DemoPlan) -> None:
        if importlib.util.find_spec("torch") is None:
            raise TorchMissing("the demo runs a real gloo job and needs torch: pip install 'fr-otel[torch]'")
        self.plan = plan
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._before: set[str] = set()
        self.started = 0.0

    def __enter__(self) -> DemoJob:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        plan = self.plan
        plan.dumps.mkdir(parents=True, exist_ok=True)
        self._before = {p.name for p in plan.dumps.iterdir()}
        env = dict(os.environ)
        src_root = str(Path(__file__).resolve().parents[2])  # `-m fr_otel.cli` works from a checkout too
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src_root, env.get("PYTHONPATH")) if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        gloo_on_loopback(env)
        env.update(plan.export_env)
        # The job's own output streams into its log while it runs: not one atomic write.
        self._log = open(plan.log, "wb")  # noqa: SIM115
        self.started = time.monotonic()
        self.proc = subprocess.Popen(plan.command(), env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def wait_for_incident(self) -> Path:
        """The new incident's folder once its ``incident.json`` and ``incident.html`` are there;
        DemoFailed when the job ends first or the plan's timeout passes."""
        assert self.proc is not None
        deadline = self.started + self.plan.timeout_s
        while True:
            for folder in sorted(p for p in self.plan.dumps.iterdir() if p.name not in self._before):
                if (folder / INCIDENT_FILE).is_file() and (folder / REPORT_FILE).is_file():
                    return folder
            code = self.proc.poll()
            if code is not None:
                raise DemoFailed(f"the job ended (exit {code}) before the agent wrote an incident; its output: "
                                 f"{self.plan.log}")
            if time.monotonic() > deadline:
                raise DemoFailed(f"no incident within {self.plan.timeout_s:g} s of the start; the job's output: "
                                 f"{self.plan.log}")
            time.sleep(_POLL_S)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.plan.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def workers(self, incident: Path | None = None) -> set[int]:
        """The ranks' pids: the launcher's children and the pids in the incident's ``ranks.json``,
        each still running the demo's script (a pid reused since is never touched)."""
        pids = set(_children(self.proc.pid)) if self.proc is not None else set()
        if incident is not None and (incident / RANKS_FILE).is_file():
            pids |= {p.pid for p in read_rank_map(str(incident / RANKS_FILE), []).values() if p.pid}
        return {pid for pid in pids if _runs(pid, str(SCRIPT))}

    def stop(self, incident: Path | None = None) -> float:
        """Stop every rank (SIGTERM, then SIGKILL after a grace period), then the launcher; seconds it took."""
        t0 = time.monotonic()
        if self.proc is None:
            return 0.0
        workers = self.workers(incident)
        _signal_all(workers, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        while any(_runs(pid, str(SCRIPT)) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_all({pid for pid in workers if _runs(pid, str(SCRIPT))}, signal.SIGKILL)
        if self.proc.poll() is None:
            _killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        self.proc = None
        return time.monotonic() - t0


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux ``/proc``; elsewhere none)."""
    out: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # after "(comm)": state, ppid, ...
        if len(fields) > 1 and fields[1] == str(pid):
            out.append(int(name))
    return out


def _runs(pid: int, script: str) -> bool:
    """Whether ``pid`` is alive (not a zombie) and runs ``script``."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and script.encode() in argv


def _signal_all(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
