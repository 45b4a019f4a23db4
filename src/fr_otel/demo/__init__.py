"""``fr-otel demo``: the live path end to end, in one command, on CPU.

A real 4-rank gloo training job runs under ``fr-otel run -- torchrun``; one rank's data loader
stalls at a known step. The agent in every rank notices (its threshold lowered to 5 s), raises
the incident and writes the dumps, the verdict files and the trace. The demo then shows what a
person on call would look at: the live verdict (who, on which host, in which step, who stopped
first, where it is now), the culprit in the ranks' ``/metrics`` with the PromQL that finds it in
Prometheus, where the trace went, the HTML report and how to re-analyse offline; then it stops
the job.

:mod:`.job` starts, watches and stops the job; :mod:`.scrape` reads the ranks' ``/metrics``;
:mod:`.show` prints. The training script is product code too: :mod:`fr_otel.scenarios.stalled_loader`.
"""

from __future__ import annotations

from .job import DemoFailed, DemoJob, DemoPlan, TorchMissing, metrics_base
from .scrape import Scrape, scrape
from .show import Findings, intro, render

__all__ = ["DemoFailed", "DemoJob", "DemoPlan", "Findings", "Scrape", "TorchMissing", "intro", "metrics_base",
           "render", "scrape"]
