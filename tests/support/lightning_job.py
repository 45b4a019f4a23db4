"""A tiny PyTorch Lightning (or HF Accelerate) CPU training script with one rank that stalls on request.

Run it as a user would (``python lightning_job.py``; Lightning's ``ddp`` re-runs this very command for
ranks 1-3, ``ddp_spawn`` spawns them; ``accelerate launch --multi_gpu`` runs it under torchrun). Each step
is the forward and backward of a 4-wide linear model on CPU: DDP all_reduces the gradients in backward,
so a rank that sleeps before its backward holds up its peers in that all_reduce.

Environment:

===================  ==========================================================================
JOB_FRAMEWORK        ``lightning`` (default) or ``accelerate``
JOB_STRATEGY         Lightning's strategy: ``ddp`` (default) or ``ddp_spawn``
JOB_DEVICES          ranks Lightning starts (default 4)
JOB_STEPS            training steps (default 6)
JOB_STALL_RANK       the rank that sleeps before its backward at step JOB_STALL_STEP (default: none)
JOB_STALL_STEP       (default 3)
JOB_STALL_SECONDS    how long at most (default 0)
JOB_RELEASE          a file: the stall ends as soon as it exists (the test has seen what it waits for)
JOB_AGENT            ``start``: ``fr_otel.start()`` at the top of the script (default: not imported)
JOB_MARKERS          folder for ``pid_rank_<r>`` (written in each rank's first step) and ``stall_start.json``
===================  ==========================================================================
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

if os.environ.get("JOB_AGENT") == "start":
    import fr_otel

    fr_otel.start()

import torch

STEPS = int(os.environ.get("JOB_STEPS", "6"))
STALL_RANK = int(os.environ.get("JOB_STALL_RANK", "-1"))
STALL_STEP = int(os.environ.get("JOB_STALL_STEP", "3"))
STALL_S = float(os.environ.get("JOB_STALL_SECONDS", "0"))
MARKERS = Path(os.environ.get("JOB_MARKERS", "markers"))
RELEASE = os.environ.get("JOB_RELEASE")


def _data() -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)


def _step(rank: int, step: int) -> None:
    """Markers, and the stall of the stalled rank (before its backward: the peers wait in DDP's all_reduce)."""
    if step == 0:
        MARKERS.mkdir(parents=True, exist_ok=True)
        (MARKERS / f"pid_rank_{rank}").write_text(str(os.getpid()))
    if rank == STALL_RANK and step == STALL_STEP:
        (MARKERS / "stall_start.json").write_text(json.dumps({"time": time.time(), "pid": os.getpid()}))
        until = time.monotonic() + STALL_S
        while time.monotonic() < until and not (RELEASE and os.path.exists(RELEASE)):
            time.sleep(0.1)


if os.environ.get("JOB_FRAMEWORK", "lightning") == "lightning":
    import lightning as L

    class Tiny(L.LightningModule):  # at module level: ddp_spawn pickles it for its children
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            _step(self.global_rank, batch_idx)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)


def lightning_main() -> None:
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ.get("JOB_DEVICES", "4")),
                        strategy=os.environ.get("JOB_STRATEGY", "ddp"), max_steps=STEPS, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(MARKERS))
    trainer.fit(Tiny(), _data())


def accelerate_main() -> None:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, data = accelerator.prepare(model, optimizer, _data())
    for step, (x, y) in enumerate(data):
        if step >= STEPS:
            break
        _step(accelerator.process_index, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.end_training()


if __name__ == "__main__":
    if os.environ.get("JOB_FRAMEWORK", "lightning") == "accelerate":
        accelerate_main()
    else:
        lightning_main()
