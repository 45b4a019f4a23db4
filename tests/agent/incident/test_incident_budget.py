"""An incident's bound grows with the job: a fixed 30 s cut a 100k-rank coordinator off mid-analysis."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from support.node_ranks import flat_rank

from fr_otel.agent.incident.rank import incident_budget_s
from fr_otel.common.ports import unused_tcp_port


def test_the_incident_bound_leaves_a_100k_rank_coordinator_time_for_its_own_work(tmp_path: Path) -> None:
    """A 4-rank job keeps its bound (gathering + export + 5 s: 30 s with the defaults); a 100k-rank job
    gets ~100 s more, over 2.5 times the ~35 s its coordinator's own work takes on a core to itself
    (bench/README.md), on a busy host too."""
    port = unused_tcp_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    small = flat_rank(tmp_path, port, 0, world=4)
    big = flat_rank(tmp_path, port, 0, world=100_000)
    fixed = small.config.gather_seconds + small.export_config.timeout_s + 5  # what the bound was for every job
    assert fixed <= incident_budget_s(small) < fixed + 0.1
    assert incident_budget_s(big) - incident_budget_s(small) >= 2.5 * 35
    del server
