"""A torchrun job across a lab's hosts: static rendezvous on node0, every worker and exit known.

Each host runs ``torchrun --nnodes N --node-rank K --master-addr <node0> --master-port P``, so
the job's store lives in node0's torchrun, as in a plain multi-node launch. torchrun puts its
workers in their own session, so the lab learns their pids from the training script's
``pid_rank_<r>`` markers (``support.train_loop`` writes them, and ``step_rank_<r>``
each step, into ``TRAIN_LOOP_MARKERS``) and polls ``/proc`` for the time each one exits.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fr_otel.testing.otlp import wait_for
from support.lab import IFACE, LabProcess
from support.lab_ns import process_gone, start_time

if TYPE_CHECKING:
    from support.lab import Lab

__all__ = ["LabJob", "Step", "fr_otel_run", "start_job"]

MASTER_PORT = 29500  # every host is a fresh network namespace: no other job holds it
POLL_S = 0.05


def fr_otel_run(*flags: str) -> list[str]:
    """The ``wrap`` that runs each host's torchrun under ``fr-otel run FLAGS --``."""
    return [sys.executable, "-m", "fr_otel.cli", "run", *flags, "--"]


@dataclass(frozen=True)
class Step:
    """The training step a rank last entered, when (``time.time()`` in the rank), on which host name."""

    step: int
    time: float
    host: str


class LabJob:
    """One torchrun per host; the workers behind them, their steps and exit times."""

    def __init__(self, lab: Lab, launchers: list[LabProcess], markers: Path, nproc_per_node: int) -> None:
        self.lab = lab
        self.launchers = launchers
        self.markers = markers
        self.nproc_per_node = nproc_per_node
        self.world_size = nproc_per_node * len(launchers)
        self._workers: dict[int, tuple[int, int | None]] = {}  # rank -> (pid, start time)
        self._worker_node: dict[int, int | None] = {}
        self._exits: dict[int, float] = {}  # rank -> time its process was first seen gone
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._poll, name="lab-job-watch", daemon=True)
        self._watch.start()

    # -- what the markers say ------------------------------------------------------------------

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._read_pids()
            now = time.time()
            for rank, (pid, start) in list(self._workers.items()):
                if rank not in self._exits and process_gone(pid, start):
                    self._exits[rank] = now
            if len(self._exits) == self.world_size or (self._launchers_done() and len(self._workers) == len(self._exits)):
                return
            self._stop.wait(POLL_S)

    def _launchers_done(self) -> bool:
        return all(p.returncode is not None for p in self.launchers)

    def _read_pids(self) -> None:
        for rank in range(self.world_size):
            if rank in self._workers:
                continue
            try:
                pid = int((self.markers / f"pid_rank_{rank}").read_text())
            except (OSError, ValueError):
                continue  # not yet written (or half-written)
            self._workers[rank] = (pid, start_time(pid))
            self._worker_node[rank] = self.lab.node_of(pid)
            self.lab.track([pid])

    def worker_pids(self) -> dict[int, int]:
        """rank -> pid of every worker that has written its marker."""
        self._read_pids()
        return {rank: pid for rank, (pid, _) in sorted(self._workers.items())}

    def wait_workers(self, timeout: float = 60) -> dict[int, int]:
        """Every worker's pid, once all have started (AssertionError with the logs if not in time)."""
        if not wait_for(lambda: len(self.worker_pids()) == self.world_size or self._launchers_done(), timeout, 0.05):
            raise AssertionError(f"workers {sorted(self._workers)} of {self.world_size} started\n{self.logs()}")
        return self.worker_pids()

    def node_of_rank(self, rank: int) -> int:
        """The host a rank ran on (by its process's namespace; static rendezvous order otherwise)."""
        node = self._worker_node.get(rank)
        return node if node is not None else rank // self.nproc_per_node

    def steps(self) -> dict[int, Step]:
        """rank -> the step it last entered (a rank that has not written one yet is absent)."""
        out = {}
        for rank in range(self.world_size):
            try:
                data = json.loads((self.markers / f"step_rank_{rank}").read_text())
                out[rank] = Step(int(data["step"]), float(data["time"]), str(data["host"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not yet, or caught half-written: the next read sees it
        return out

    def wait_step(self, step: int, timeout: float = 120) -> dict[int, Step]:
        """Wait until every rank has entered ``step``; returns the steps then (AssertionError if never)."""
        def reached() -> bool:
            steps = self.steps()
            return len(steps) == self.world_size and min(s.step for s in steps.values()) >= step
        if not wait_for(lambda: reached() or self._launchers_done(), timeout, 0.02) or not reached():
            raise AssertionError(f"step {step} never reached by every rank: {self.steps()}\n{self.logs()}")
        return self.steps()

    # -- exits ---------------------------------------------------------------------------------

    def worker_exit_times(self) -> dict[int, float | None]:
        """rank -> when its process was first seen gone (within 50 ms), None while it lives."""
        return {rank: self._exits.get(rank) for rank in range(self.world_size)}

    def done(self) -> bool:
        """Every torchrun and every known worker has exited."""
        return self._launchers_done() and all(rank in self._exits for rank in self._workers)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for every torchrun and worker to exit; False if some still run."""
        return wait_for(self.done, timeout, POLL_S)

    def stacks(self, settle: float = 1.0) -> None:
        """SIGUSR1 to every live worker: each prints every thread's Python stack to its torchrun's stderr."""
        for rank, (pid, start) in sorted(self._workers.items()):
            if not process_gone(pid, start):
                try:
                    os.kill(pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        time.sleep(settle)

    def logs(self, tail: int = 3000) -> str:
        """The end of each host's torchrun output, headed by its host name."""
        return "\n".join(f"--- {self.lab.hostnames[p.node]} (exit {p.returncode}) ---\n{p.output()[-tail:]}"
                         for p in self.launchers)

    def close(self) -> None:
        self._stop.set()


def start_job(lab: Lab, script: str | os.PathLike[str], nproc_per_node: int, env: Mapping[str, str], *,
              script_args: Sequence[str] = (), wrap: Sequence[str] = (), log_dir: str | os.PathLike[str] | None = None,
              markers: str | os.PathLike[str] | None = None, master_port: int = MASTER_PORT,
              fr_buffer: int = 2000) -> LabJob:
    """Start ``[*wrap, torchrun ..., script, *script_args]`` on every host of ``lab``.

    ``env`` is the whole environment; a ``{node}`` in a value becomes each host's name (e.g.
    ``FR_OTEL_OUT_DIR=/tmp/x/{node}``: one disk per host). Set here: ``GLOO_SOCKET_IFNAME``
    (the host's lab interface), ``TORCH_FR_BUFFER_SIZE`` and ``TRAIN_LOOP_MARKERS``.
    """
    folder = Path(log_dir) if log_dir is not None else lab.log_dir
    marker_dir = Path(markers) if markers is not None else folder / "markers"
    marker_dir.mkdir(parents=True, exist_ok=True)
    launchers = []
    for node in range(lab.size):
        host_env = {key: value.replace("{node}", lab.hostnames[node]) for key, value in env.items()}
        host_env.update(GLOO_SOCKET_IFNAME=IFACE, TORCH_FR_BUFFER_SIZE=str(fr_buffer),
                        TRAIN_LOOP_MARKERS=str(marker_dir))
        argv = [*wrap, sys.executable, "-m", "torch.distributed.run", "--nnodes", str(lab.size),
                "--node-rank", str(node), "--master-addr", lab.ips[0], "--master-port", str(master_port),
                "--nproc-per-node", str(nproc_per_node), str(script), *script_args]
        launchers.append(lab.spawn(node, argv, host_env, folder, name="torchrun"))
    return LabJob(lab, launchers, marker_dir, nproc_per_node)
