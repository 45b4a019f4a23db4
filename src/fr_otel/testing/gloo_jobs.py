"""Real gloo hangs on CPU, frozen into Flight Recorder dumps, for tests of your own set-up.

The scenarios and the job that runs them are product code (:mod:`fr_otel.scenarios`, which
``fr-otel demo`` uses too); this is their name in the test kit. Importing it never imports torch.

    out = make_dumps("subgroup_stall", tmp_path)   # pickle/rank_<r>, json/rank_<r>.json, scenario.json
"""

from __future__ import annotations

from ..scenarios import SCENARIOS, make_dumps

__all__ = ["SCENARIOS", "make_dumps"]
