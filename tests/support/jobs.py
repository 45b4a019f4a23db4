"""Real training jobs for the tests: the small gloo loop, its environment, a job killed whole on teardown."""

from __future__ import annotations

import importlib.util
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from fr_otel.scenarios.job import gloo_on_loopback
from fr_otel.testing.otlp import wait_for

__all__ = ["JOB_TIMEOUT_S", "TRAIN_LOOP", "Job", "installed_bin", "job_env", "torchrun", "wait_file",
           "write_executable"]

TRAIN_LOOP = Path(importlib.util.find_spec("support.train_loop").origin)  # type: ignore[union-attr,arg-type]
JOB_TIMEOUT_S = 150


def job_env(tmp: Path, **extra: str) -> dict[str, str]:
    """This environment without fr-otel's, OpenTelemetry's or the loop's settings, plus quick,
    loopback-only defaults (poll every 0.5 s, /metrics on 127.0.0.1, output and node folders under ``tmp``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "OTEL_", "TRAIN_LOOP_"))}
    env.update(OMP_NUM_THREADS="1", TRAIN_LOOP_MARKERS=str(tmp / "markers"), FR_OTEL_POLL_INTERVAL="0.5",
               FR_OTEL_METRICS_ADDR="127.0.0.1", FR_OTEL_OUT_DIR=str(tmp / "out"), FR_OTEL_NODE_DIR=str(tmp / "node"),
               OTEL_SERVICE_NAME="fr-otel-test")
    gloo_on_loopback(env)
    env.update(extra)
    return env


def torchrun(nproc: int) -> list[str]:
    """``torchrun --standalone --nproc-per-node N train_loop.py`` (as ``python -m``, any install)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            str(TRAIN_LOOP)]


def write_executable(path: Path, text: str) -> None:
    """A script file its owner may run."""
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def installed_bin(folder: Path) -> Path:
    """``folder`` with ``fr-otel`` (this checkout's CLI) and ``torchrun`` (this interpreter's), as a
    job finds them on ``PATH`` where fr-otel is installed: put it first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    write_executable(folder / "fr-otel", f'#!/bin/sh\nexec "{sys.executable}" -m fr_otel.cli "$@"\n')
    console = Path(sys.executable).parent / "torchrun"
    if console.is_file():  # the console script users run: the launcher exactly as it starts there
        (folder / "torchrun").symlink_to(console)
    else:
        write_executable(folder / "torchrun", f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
    return folder


class Job:
    """A job in its own session, output to a file; :meth:`kill` ends it whole.

    torchrun starts each worker in a session of its own, so killing the job's session alone
    would orphan them: :meth:`kill` first asks the launcher (SIGTERM, which it passes on to
    its workers), then kills the session and every rank whose ``pid_rank_<r>`` marker is in
    ``env["TRAIN_LOOP_MARKERS"]``.
    """

    def __init__(self, cmd: list[str], env: dict[str, str], tmp: Path, name: str = "job") -> None:
        markers = env.get("TRAIN_LOOP_MARKERS")
        self.markers = Path(markers) if markers else None
        self.log_path = tmp / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait(self, timeout: float = JOB_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.flush()

    @property
    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def rank_pids(self) -> dict[int, int]:
        """Rank -> pid of each rank that has written its marker so far."""
        if self.markers is None:
            return {}
        return {int(p.name.rsplit("_", 1)[1]): int(p.read_text()) for p in self.markers.glob("pid_rank_*")
                if p.read_text().strip().isdigit()}

    def kill(self) -> None:
        if self.proc.returncode is None:
            # The session's id stays ours while its leader is unreaped: signal, wait without reaping.
            _signal_group(self.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and os.waitid(os.P_PID, self.proc.pid,
                                                            os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                time.sleep(0.1)
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in self.rank_pids().values():
            if self.markers is not None and _runs_with(pid, f"TRAIN_LOOP_MARKERS={self.markers}"):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self._log.close()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _runs_with(pid: int, variable: str) -> bool:
    """Whether process ``pid`` is still one of ours: alive, with ``variable`` (NAME=value) in its environment."""
    try:
        return variable.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def wait_file(path: Path, job: Job, timeout: float = 90) -> Path:
    """``path`` once the job wrote it (fails with the job's output if it never does)."""
    ok = wait_for(lambda: path.is_file() or job.proc.poll() is not None, timeout=timeout, interval=0.1)
    assert ok and path.is_file(), f"{path.name} never appeared; job output:\n{job.output[-4000:]}"
    return path
