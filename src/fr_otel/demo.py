"""The main job in one command: a real gloo hang on CPU, captured as every rank's dump.

One rank of a 4-rank gloo job skips an all_reduce; the others block in it. Every rank's
Flight Recorder is pulled while the job is stuck; the dumps then go through the same
incident pipeline as any user's dumps (``fr-otel demo``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["TorchMissing", "run_demo"]

DEMO_SCENARIO = "skip_allreduce"


class TorchMissing(RuntimeError):
    """The demo runs a real torch job: it needs the ``fr-otel[torch]`` extra."""


def run_demo(out_dir: str | Path, *, scenario: str = DEMO_SCENARIO, world_size: int = 4) -> Path:
    """Run a real hanging gloo job and dump every rank; returns the dumps' folder. Raises
    TorchMissing without torch."""
    if importlib.util.find_spec("torch") is None:
        raise TorchMissing("the demo runs a real gloo job and needs torch: pip install 'fr-otel[torch]'")
    from .scenarios import (
        make_dumps,  # imports no torch itself; the job runs in a child
    )

    out = make_dumps(scenario, Path(out_dir), world_size=world_size, timeout_s=180)
    return out / "pickle"
