"""The main job in one command: a real gloo hang on CPU, captured and analysed.

One rank of a 4-rank gloo job skips an all_reduce; the others block in it.
Every rank's Flight Recorder is pulled while the job is stuck, and the dumps go
through the same reader and analysis as any user's dumps.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .diagnosis.analysis import analyze
from .diagnosis.job import Job, build_job
from .diagnosis.verdict import Verdict
from .read.reader import read_dumps

__all__ = ["DemoResult", "TorchMissing", "run_demo"]

DEMO_SCENARIO = "skip_allreduce"


class TorchMissing(RuntimeError):
    """The demo runs a real torch job: it needs the ``fr-otel[torch]`` extra."""


@dataclass(frozen=True, slots=True)
class DemoResult:
    job: Job
    verdict: Verdict
    dumps_dir: Path


def run_demo(out_dir: str | Path, *, scenario: str = DEMO_SCENARIO, world_size: int = 4) -> DemoResult:
    """Run a real hanging gloo job, dump every rank, analyse; raises TorchMissing without torch."""
    if importlib.util.find_spec("torch") is None:
        raise TorchMissing("the demo runs a real gloo job and needs torch: pip install 'fr-otel[torch]'")
    from .scenarios import make_dumps  # imports no torch itself; the job runs in a child

    out = make_dumps(scenario, Path(out_dir), world_size=world_size, timeout_s=180)
    dumps_dir = out / "pickle"
    job = build_job(read_dumps(dumps_dir))
    return DemoResult(job=job, verdict=analyze(job), dumps_dir=dumps_dir)
