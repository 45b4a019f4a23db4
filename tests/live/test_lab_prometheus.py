"""Prometheus names a lost node (issue 23): a real 3-host lab job under ``fr-otel run``, a real
Prometheus on node0 scraping every rank's agent at its lab address with the shipped rules (only
FrOtelNodeLost's ``for:`` lowered), node1 partitioned mid-training."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.lab import Lab, lab_unavailable
from support.lab_job import fr_otel_run
from test_operate_static import (
    RULES_FILE,
    iter_panels,
    load_dashboards,
    substitute,
    variable_values,
)

from fr_otel.testing.prometheus import PrometheusServer, find_prometheus

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.lab,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
    pytest.mark.skipif(bool(lab_unavailable()), reason=lab_unavailable() or ""),
    pytest.mark.skipif(find_prometheus() is None, reason="needs the prometheus binary (Debian's prometheus)"),
]

TRAIN_LOOP = Path(importlib.util.find_spec("fr_otel.testing.train_loop").origin)  # type: ignore[union-attr,arg-type]
BASE_PORT = 9740  # the agent's default: rank LOCAL_RANK serves base + LOCAL_RANK
FOR = "5s"  # FrOtelNodeLost's `for:` here (1m as shipped)
NODES, PER_NODE, LOST = 3, 2, 1


def _rules_with_a_short_for(folder: Path) -> Path:
    """The shipped rules file with FrOtelNodeLost's ``for:`` lowered to FOR; everything else as is."""
    rules = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    (alert,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "FrOtelNodeLost"]
    alert["for"] = FOR
    path = folder / "fr-otel-rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    return path


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "OTEL_", "TRAIN_LOOP_"))}
    # Survivors wait on node1 for 120 s: their agents answer well past the alert.
    env.update(OMP_NUM_THREADS="1", TRAIN_LOOP_STEPS="100000", TRAIN_LOOP_STEP_SLEEP="0.2",
               TRAIN_LOOP_GLOO_TIMEOUT="120", FR_OTEL_OUT_DIR=str(tmp / "out" / "{node}"))
    return env


def _firing(prom: PrometheusServer) -> list[dict[str, Any]]:
    return [a for a in prom.api("alerts")["alerts"] if a["labels"]["alertname"] == "FrOtelNodeLost"
            and a["state"] == "firing"]


def _panel_rows(prom: PrometheusServer, title: str) -> dict[str, dict[tuple[str, str], float]]:
    """refId -> {(host, rank): value} of an overview panel's queries, variables as 'All'."""
    dash = load_dashboards()["fr-otel-overview.json"]
    (panel,) = [p for p in iter_panels(dash["panels"]) if p.get("title") == title]
    values = variable_values(dash)
    return {t["refId"]: {(s.labels["host"], s.labels["rank"]): s.value
                         for s in prom.query(substitute(t["expr"], values))} for t in panel["targets"]}


def test_a_partitioned_node_is_named_by_the_node_lost_alert_and_the_dashboard_and_no_other_host_is(
        tmp_path: Path) -> None:
    """Partition node1 of a training 3x2 job: FrOtelNodeLost fires for node1 alone, naming ranks 2, 3 and their
    addresses, within 30 s; the overview's lost-hosts table shows them, the whole host down."""
    with Lab(NODES, log_dir=tmp_path) as lab:
        targets = [f"{ip}:{BASE_PORT + local}" for ip in lab.ips for local in range(PER_NODE)]
        with lab.prometheus(0, targets, labels={"training_job": "lab"}, scrape_interval="1s",
                            rule_files=[_rules_with_a_short_for(tmp_path)], workdir=tmp_path / "prometheus") as prom:
            job = lab.torchrun(TRAIN_LOOP, PER_NODE, _env(tmp_path), wrap=fr_otel_run("--stall-seconds", "10"))
            try:
                prom.wait_for("count(rank:fr_agent_up:last_info == 1) == 6", timeout=150)
                job.wait_step(2, timeout=60)
            except (TimeoutError, AssertionError) as exc:
                pytest.fail(f"{exc}\n{prom.targets_health()}\n{job.logs()}")
            never_up_then = prom.query('max_over_time(ALERTS{alertname="FrOtelNodeLost"}[15m])')
            fault = lab.partition(LOST)
            deadline = fault + 60
            while not (firing := _firing(prom)) and time.time() < deadline:
                time.sleep(0.5)
            fired_after = time.time() - fault
            ever = prom.query('max_over_time(ALERTS{alertname="FrOtelNodeLost"}[15m])')
            rows = _panel_rows(prom, "Lost ranks and hosts")
            ranks = [r for r in range(job.world_size) if job.node_of_rank(r) == LOST]
            context = f"{prom.query('up')}\n{job.logs()}"
    assert never_up_then == [], "targets that had never answered were called lost"
    assert len(firing) == 1, f"FrOtelNodeLost never fired within 60 s of the partition\n{context}"
    (alert,) = firing
    assert fired_after < 30
    assert ranks == [2, 3]
    assert alert["labels"]["host"] == "node1" and alert["labels"]["training_job"] == "lab"
    assert alert["annotations"]["summary"] == "Host node1 of training job lab is lost: ranks 2, 3 stopped answering"
    assert "(rank 2 at 10.213.0.2:9740, rank 3 at 10.213.0.2:9741)" in alert["annotations"]["description"]
    assert {s.labels["host"] for s in ever} == {"node1"}, "another host was named, pending or firing"
    assert rows["A"] == {("node1", "2"): 1.0, ("node1", "3"): 1.0}  # the host's ranks down: all
    assert rows["B"] == {("node1", "2"): 1.0, ("node1", "3"): 1.0}  # whole host
    assert set(rows["C"]) == {("node1", "2"), ("node1", "3")} and all(0 < s < 60 for s in rows["C"].values())
    assert lab.leftovers() == []
