"""A slow host's incident says it was raised while the job ran, and under which stall threshold: the verdict then
weighs no wait younger than that as a hang (diagnosis.pace), live and offline. A real TCPStore on loopback."""

from __future__ import annotations

import dataclasses
import json
import pickle
from datetime import timedelta
from pathlib import Path

import pytest

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from support.node_ranks import flat_rank

from fr_otel.agent.incident.runner import IncidentRunner
from fr_otel.agent.observe.poller import ProgressTracker
from fr_otel.agent.slow_watch import incident_for_holdups
from fr_otel.common.ports import unused_tcp_port
from fr_otel.diagnosis.lateness import Holdup
from fr_otel.diagnosis.verdict import AnalysisOptions
from fr_otel.incident.trigger import Reason, Trigger


def test_a_slow_hosts_incident_carries_the_agents_stall_threshold_to_its_verdict(tmp_path: Path) -> None:
    """The incident raised for node1 holding up group 0: its reason is a slow one and incident.json's root
    attributes give back the agent's stall threshold (FR_OTEL_STALL_SECONDS, here 45 s)."""
    port = unused_tcp_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    me = flat_rank(tmp_path, port, 0, world=1, gather_seconds=2.0)
    recorder = pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []})
    me = dataclasses.replace(me, read_recorder=lambda: recorder, config=dataclasses.replace(me.config, stall_seconds=45.0))
    runner = IncidentRunner(me, ProgressTracker())
    holdup = Holdup("node1", (2, 3), "0", "default_pg", True, 0.3, 0.2, 0.5, 0.4, 0.45)
    incident_for_holdups(runner)(holdup, "node1 (ranks 2-3) has held up default_pg (group 0) for 15 s")
    assert runner.wait_idle(30)
    owner = me.channel.owner(1)
    trigger = Trigger.from_record(1, owner or {})
    assert trigger is not None and trigger.reason is Reason.SLOW and trigger.threshold_s == 45.0
    assert (trigger.slow_ranks, trigger.slow_host) == ((2, 3), "node1")
    found = list(tmp_path.glob("**/incident.json"))
    assert len(found) == 1, found
    root = [tuple(a) for a in json.loads(found[0].read_text())["root_attributes"]]
    kept = Trigger.from_root_attributes(root)
    assert kept is not None and kept.analysis(AnalysisOptions()) == AnalysisOptions(running_stall_s=45.0)
    runner.stop(5)
    del server
