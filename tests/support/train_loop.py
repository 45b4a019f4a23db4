"""A small CPU gloo training loop for torchrun, with one rank that stalls on request.

Run it as a script (it never imports fr_otel unless told to), e.g.::

    TRAIN_LOOP_STALL_RANK=2 TRAIN_LOOP_STALL_SECONDS=20 \\
        python -m torch.distributed.run --standalone --nproc-per-node 4 path/to/train_loop.py

or one process per rank as ``srun`` starts them (no torchrun): with ``RANK`` unset, the rank
and world size are ``SLURM_PROCID`` and ``SLURM_NTASKS``, as Slurm training scripts do
(``MASTER_ADDR``/``MASTER_PORT`` from the environment).

Each step: forward and backward of a small MLP, one ``all_reduce`` of the flattened
gradients (the collective the others wait in when a rank stalls), an SGD step. The stall
is a sleep just before the stalled rank's ``all_reduce`` at step ``TRAIN_LOOP_STALL_STEP``:
its peers sit in that collective; if the sleep is shorter than the gloo timeout the job
recovers and finishes normally.

Environment:

=========================  ================================================================
TRAIN_LOOP_STEPS           steps (default 40)
TRAIN_LOOP_STEP_SLEEP      seconds of "data loading" per step (default 0.05)
TRAIN_LOOP_SLOW_RANK       a rank whose "data loading" takes TRAIN_LOOP_SLOW_SECONDS more every step: a straggler
                           (default: none)
TRAIN_LOOP_SLOW_SECONDS    how much more (default 0)
TRAIN_LOOP_PAUSE_STEP      a step whose "data loading" lasts TRAIN_LOOP_PAUSE_SECONDS instead (default: none):
                           a fault injected during it lands before that step's all_reduce, in that step
TRAIN_LOOP_PAUSE_SECONDS   how long (default 0)
TRAIN_LOOP_HIDDEN          MLP width (default 64)
TRAIN_LOOP_STALL_RANK      rank that stalls (default: none)
TRAIN_LOOP_STALL_STEP      step at which it stalls (default 10)
TRAIN_LOOP_STALL_SECONDS   how long (default 0)
TRAIN_LOOP_STALL_IN        ``loader``: the stall is inside the rank's ``DataLoader`` (its dataset reading the step's
                           batch blocks), as a hung file system or data service makes a loader block; default: a
                           sleep in the training loop itself, just before the ``all_reduce``
TRAIN_LOOP_STALL_ATTEMPT   only in this attempt of the job (torchelastic's TORCHELASTIC_RESTART_COUNT; default:
                           every attempt): a restarted job then runs through
TRAIN_LOOP_RAISE_RANK      rank that raises an uncaught RuntimeError instead (default: none)
TRAIN_LOOP_RAISE_STEP      step at which it raises (default 5)
TRAIN_LOOP_EXIT_RANK       rank that leaves at once with ``os._exit(3)``: no hook runs (default: none)
TRAIN_LOOP_EXIT_STEP       step at which it leaves (default 5)
TRAIN_LOOP_GLOO_TIMEOUT    process group timeout in seconds (default 120)
TRAIN_LOOP_AGENT           ``early``: ``fr_otel.start()`` before ``init_process_group``;
                           ``late``: after it; unset: fr_otel is never imported
TRAIN_LOOP_MARKERS         folder for ``pid_rank_<r>``, ``step_rank_<r>`` (``{"step", "time", "host"}``:
                           the step it last entered), ``stall_start.json``, ``done_rank_<r>`` (optional)
TRAIN_LOOP_HOLD            a file: after the last step every rank waits (at most 120 s) until it
                           exists, so a test can look at a running job as long as it needs
TRAIN_LOOP_CHILD           ``subprocess`` or ``spawn``: before ``init_process_group`` each rank runs one
                           child Python process (a subprocess, or a multiprocessing ``spawn`` child)
                           that inherits its environment and exits at once (default: none)
=========================  ================================================================

SIGUSR1 prints every thread's Python stack to stderr (``faulthandler``): where a hung rank sits.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["main"]


def _grad(p: torch.Tensor) -> torch.Tensor:
    """``p``'s gradient, which ``backward()`` has just filled (an error, not a silent skip, if not)."""
    if p.grad is None:
        raise RuntimeError("a parameter has no gradient after backward()")
    return p.grad


def _env(name: str, default: str) -> str:
    return os.environ.get(f"TRAIN_LOOP_{name}", default)


def _mark(path: Path, text: str) -> None:
    """Write a marker all at once (a test polling for it must never read half of it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _child() -> None:
    """What a helper process of the training script does: nothing, at once."""


def _start_child(how: str) -> None:
    """One child process of this rank, before its process group exists, run to its end."""
    if how == "subprocess":
        import subprocess
        import sys

        subprocess.run([sys.executable, "-c", "pass"], check=True)
    elif how == "spawn":
        import multiprocessing

        child = multiprocessing.get_context("spawn").Process(target=_child)
        child.start()
        child.join(60)


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    agent_mode = _env("AGENT", "")
    if agent_mode == "early":
        import fr_otel

        fr_otel.start()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    _start_child(_env("CHILD", ""))
    timeout = timedelta(seconds=float(_env("GLOO_TIMEOUT", "120")))
    if not os.environ.get("RANK") and os.environ.get("SLURM_PROCID"):  # srun: one task per rank
        dist.init_process_group("gloo", timeout=timeout, rank=int(os.environ["SLURM_PROCID"]),
                                world_size=int(os.environ["SLURM_NTASKS"]))
    else:
        dist.init_process_group("gloo", timeout=timeout)
    if agent_mode == "late":
        import fr_otel

        fr_otel.start()
    rank = dist.get_rank()
    steps = int(_env("STEPS", "40"))
    pause = float(_env("STEP_SLEEP", "0.05"))
    long_step = int(_env("PAUSE_STEP", "-1"))
    long_pause = float(_env("PAUSE_SECONDS", "0"))
    slow_rank, slow_s = int(_env("SLOW_RANK", "-1")), float(_env("SLOW_SECONDS", "0"))
    hidden = int(_env("HIDDEN", "64"))
    stall_rank = int(_env("STALL_RANK", "-1"))
    stall_step = int(_env("STALL_STEP", "10"))
    stall_s = float(_env("STALL_SECONDS", "0"))
    attempt = _env("STALL_ATTEMPT", "")
    if attempt and attempt != os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"):
        stall_s = 0.0
    raise_rank = int(_env("RAISE_RANK", "-1"))
    raise_step = int(_env("RAISE_STEP", "5"))
    exit_rank = int(_env("EXIT_RANK", "-1"))
    exit_step = int(_env("EXIT_STEP", "5"))
    markers = Path(_env("MARKERS", "")) if _env("MARKERS", "") else None
    if markers is not None:
        markers.mkdir(parents=True, exist_ok=True)
        _mark(markers / f"pid_rank_{rank}", str(os.getpid()))

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    params = list(model.parameters())
    host = socket.gethostname()
    in_loader = _env("STALL_IN", "") == "loader"

    def mark_stall(step: int) -> None:
        if markers is not None:
            markers.mkdir(parents=True, exist_ok=True)
            _mark(markers / "stall_start.json", json.dumps({"rank": rank, "step": step, "time": time.time()}))

    class Batches(torch.utils.data.Dataset):  # type: ignore[type-arg]
        """One batch per step; the stalled rank's read of its stalled step's batch blocks."""

        def __len__(self) -> int:
            return steps

        def __getitem__(self, step: int) -> torch.Tensor:
            if in_loader and rank == stall_rank and step == stall_step and stall_s > 0:
                mark_stall(step)
                time.sleep(stall_s)
            return torch.randn(32, hidden)

    batches = iter(torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=0))
    for step in range(steps):
        if markers is not None:  # a reader may catch it half-written: it retries
            _mark(markers / f"step_rank_{rank}", json.dumps({"step": step, "time": time.time(), "host": host}))
        time.sleep((long_pause if step == long_step else pause) + (slow_s if rank == slow_rank else 0.0))
        x = next(batches)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        flat = torch.cat([_grad(p).reshape(-1) for p in params])
        if rank == stall_rank and step == stall_step and stall_s > 0 and not in_loader:
            mark_stall(step)
            time.sleep(stall_s)  # before the all_reduce: its peers wait in it
        if rank == raise_rank and step == raise_step:
            raise RuntimeError(f"injected failure at step {step}")
        if rank == exit_rank and step == exit_step:
            os._exit(3)
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for p in params:
            n = p.numel()
            _grad(p).copy_(flat[offset:offset + n].view_as(p))
            offset += n
        opt.step()
    hold = _env("HOLD", "")
    deadline = time.monotonic() + 120
    while hold and not os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()
    if markers is not None:
        markers.mkdir(parents=True, exist_ok=True)
        _mark(markers / f"done_rank_{rank}", str(time.time()))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
