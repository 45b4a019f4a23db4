"""Real hangs on demand: a registry of gloo-job scenarios (name → plan → what each rank does).

``fr-otel demo`` runs one; the test suite runs them all. Each scenario lives in one class in
:mod:`.catalog`; :func:`make_dumps` runs it as a real multi-process gloo job on CPU (in a child
interpreter: importing this package never imports torch) and writes every rank's dump::

    out = make_dumps("skip_allreduce", "dumps/")   # dumps/pickle/rank_<r>, json/, scenario.json
"""

from __future__ import annotations

from .catalog import SCENARIOS
from .job import main, make_dumps
from .rank import Plan, Scenario

__all__ = ["SCENARIOS", "Plan", "Scenario", "main", "make_dumps"]
