"""Real torchrun gloo jobs running fr-otel's training loop (``fr_otel.testing.train_loop``)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

from fr_otel.scenarios.job import gloo_on_loopback
from fr_otel.testing.otlp import wait_for

__all__ = ["JOB_TIMEOUT_S", "TRAIN_LOOP", "Job", "job_env", "torchrun", "wait_file"]

TRAIN_LOOP = Path(importlib.util.find_spec("fr_otel.testing.train_loop").origin)  # type: ignore[union-attr,arg-type]
JOB_TIMEOUT_S = 150


def job_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The test's environment for a job: no inherited FR_OTEL_/OTEL_/TRAIN_LOOP_ settings, markers
    and --out under ``tmp``, gloo on loopback, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "OTEL_", "TRAIN_LOOP_"))}
    env.update(OMP_NUM_THREADS="1", TRAIN_LOOP_MARKERS=str(tmp / "markers"), FR_OTEL_POLL_INTERVAL="0.5",
               FR_OTEL_METRICS_ADDR="127.0.0.1", FR_OTEL_OUT_DIR=str(tmp / "out"), OTEL_SERVICE_NAME="fr-otel-test")
    gloo_on_loopback(env)
    env.update(extra)
    return env


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            str(TRAIN_LOOP)]


class Job:
    """A torchrun job in its own session (killed whole on teardown), output to a file."""

    def __init__(self, cmd: list[str], env: dict[str, str], tmp: Path) -> None:
        self.log_path = tmp / "job.log"
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

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self._log.close()


def wait_file(path: Path, job: Job, timeout: float = 90) -> Path:
    """``path`` once the job wrote it (fails with the job's output if it never does)."""
    ok = wait_for(lambda: path.is_file() or job.proc.poll() is not None, timeout=timeout, interval=0.1)
    assert ok and path.is_file(), f"{path.name} never appeared; job output:\n{job.output[-4000:]}"
    return path
