"""A small CPU training job for torchrun in which one rank's data loader stalls: the live demo's job.

``fr-otel demo`` runs it as ``fr-otel run --stall-seconds 5 -- torchrun --nproc-per-node 4
stalled_loader.py --stall-rank 2 --stall-step 5``. It is an ordinary training script, as a user
writes one, and never imports fr_otel: ``fr-otel run`` puts the agent into every rank.

Each step: a batch from the rank's ``DataLoader``, forward and backward of a small MLP, one
``all_reduce`` of the flattened gradients, an SGD step. At ``--stall-step`` the stalled rank's
dataset blocks in Python reading a sample (as a hung network file system or a dead data service
makes a loader block), so that rank never issues the step's ``all_reduce`` and its peers wait
in it. The stall lasts ``--stall-seconds`` (default 120 s: the demo stops the job long before, and
a job the demo could not stop recovers and ends by itself within about two minutes); the gloo
timeout is longer still, so nothing times out while the demo looks at the stuck job.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["main"]


def _grad(p: torch.Tensor) -> torch.Tensor:
    """``p``'s gradient, which ``backward()`` has just filled (an error, not a silent skip, if not)."""
    if p.grad is None:
        raise RuntimeError("a parameter has no gradient after backward()")
    return p.grad


def read_sample(index: int, stall: bool, stall_s: float) -> list[float]:
    """One training sample from storage; on the stalled rank's stalled step, storage never answers."""
    if stall:
        time.sleep(stall_s)  # the demo's culprit sits here: in Python, in its data loader, not in a collective
    return [((index * 7919 + k) % 97) / 97.0 for k in range(32)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40, help="training steps (default: %(default)s)")
    ap.add_argument("--batch", type=int, default=8, help="samples per step (default: %(default)s)")
    ap.add_argument("--stall-rank", type=int, default=2, help="the rank whose loader stalls (default: %(default)s)")
    ap.add_argument("--stall-step", type=int, default=5,
                    help="the training step (counted from 0) at which it stalls (default: %(default)s)")
    ap.add_argument("--stall-seconds", type=float, default=120.0, help="how long (default: %(default)s)")
    ap.add_argument("--step-seconds", type=float, default=0.05,
                    help="time of one step's other work (default: %(default)s)")
    ap.add_argument("--gloo-timeout", type=float, default=600.0,
                    help="the process group's timeout in seconds (default: %(default)s)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.gloo_timeout))
    rank = dist.get_rank()

    class SampleDataset(Dataset[Any]):
        """This rank's shard: ``steps × batch`` samples, read one at a time."""

        def __len__(self) -> int:
            return int(args.steps * args.batch)

        def __getitem__(self, index: int) -> torch.Tensor:
            stall = rank == args.stall_rank and index // args.batch == args.stall_step
            return torch.tensor(read_sample(index, stall, args.stall_seconds))

    loader = DataLoader(SampleDataset(), batch_size=args.batch, num_workers=0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    params = list(model.parameters())
    for batch in loader:
        loss = model(batch).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        flat = torch.cat([_grad(p).reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for p in params:
            _grad(p).copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()
        time.sleep(args.step_seconds)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} (pid {os.getpid()}): {args.steps} steps done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
