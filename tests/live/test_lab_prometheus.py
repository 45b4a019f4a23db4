"""Prometheus names a lost node: a real 3-host lab job under ``fr-otel run``, a real
Prometheus on node0 scraping every rank's agent at its lab address with the shipped rules (only
FrOtelNodeLost's ``for:`` lowered). Node1 partitioned mid-training, then node2 frozen (node0 and
its Prometheus go on answering: the survivors wait 120 s in their collective); or node1 crashed
(every process of it killed: the survivors get a connection reset and the whole job is gone
within seconds, before any ``for:``)."""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.lab import Lab, lab_unavailable
from support.lab_job import fr_otel_run
from support.rules import write_lowered_rules
from support.operate import (
    iter_panels,
    load_dashboards,
    substitute,
    variable_values,
)

from support.prometheus import PrometheusServer, find_prometheus

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.lab,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
    pytest.mark.skipif(bool(lab_unavailable()), reason=lab_unavailable() or ""),
    pytest.mark.skipif(find_prometheus() is None, reason="needs the prometheus binary (Debian's prometheus)"),
]

TRAIN_LOOP = Path(importlib.util.find_spec("support.train_loop").origin)  # type: ignore[union-attr,arg-type]
BASE_PORT = 9740  # the agent's default: rank LOCAL_RANK serves base + LOCAL_RANK
FOR = "5s"  # FrOtelNodeLost's `for:` here (1m as shipped)
# A crash's survivors stop answering up to 4.5 s apart here (their exit paths): under a 5 s `for:`
# the first of them could be named while the last still answers; the shipped 1m never does.
CRASH_FOR = "10s"


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "OTEL_", "TRAIN_LOOP_"))}
    # Survivors wait on node1 for 120 s: their agents answer well past the alert.
    env.update(OMP_NUM_THREADS="1", TRAIN_LOOP_STEPS="100000", TRAIN_LOOP_STEP_SLEEP="0.2",
               TRAIN_LOOP_GLOO_TIMEOUT="120", FR_OTEL_OUT_DIR=str(tmp / "out" / "{node}"))
    return env


@contextmanager
def _scraped_job(lab: Lab, tmp: Path, node_lost_for: str) -> Iterator[tuple[PrometheusServer, Any]]:
    """The 3x2 job under `fr-otel run`, scraped every second by a Prometheus on node0 whose FrOtelNodeLost
    waits ``node_lost_for``; yielded once every agent answers and the job trains."""
    targets = [f"{ip}:{BASE_PORT + local}" for ip in lab.ips for local in range(2)]
    with lab.prometheus(0, targets, labels={"training_job": "lab"}, scrape_interval="1s",
                        rule_files=[write_lowered_rules(tmp, fors={"FrOtelNodeLost": node_lost_for})],
                        workdir=tmp / "prometheus") as prom:
        job = lab.torchrun(TRAIN_LOOP, 2, _env(tmp), wrap=fr_otel_run("--stall-seconds", "10"))
        try:
            prom.wait_for("count(rank:fr_agent_up:last_info == 1) == 6", timeout=150)
            job.wait_step(2, timeout=60)
        except (TimeoutError, AssertionError) as exc:
            pytest.fail(f"{exc}\n{prom.targets_health()}\n{job.logs()}")
        yield prom, job


def _named(prom: PrometheusServer, state: str = "") -> set[str]:
    """Every host FrOtelNodeLost has named so far, pending or firing (or only in ``state``)."""
    return {s.labels["host"] for s in prom.query(
        f'max_over_time(ALERTS{{alertname="FrOtelNodeLost",alertstate=~"{state or ".*"}"}}[15m])')}


def _fires_for(prom: PrometheusServer, host: str, since: float, context: str) -> tuple[dict[str, Any], float]:
    """FrOtelNodeLost's firing alert for ``host`` and how long after ``since`` it fired (60 s at most)."""
    while time.time() < since + 60:
        firing = [a for a in prom.api("alerts")["alerts"] if a["labels"]["alertname"] == "FrOtelNodeLost"
                  and a["state"] == "firing" and a["labels"]["host"] == host]
        if firing:
            return firing[0], time.time() - since
        time.sleep(0.5)
    pytest.fail(f"FrOtelNodeLost never fired for {host}: {prom.query('up')}\n{context}")


def _panel_rows(prom: PrometheusServer, title: str) -> dict[str, dict[tuple[str, str], float]]:
    """refId -> {(host, rank): value} of an overview panel's queries, variables as 'All'."""
    dash = load_dashboards()["fr-otel-overview.json"]
    (panel,) = [p for p in iter_panels(dash["panels"]) if p.get("title") == title]
    values = variable_values(dash)
    return {t["refId"]: {(s.labels["host"], s.labels["rank"]): s.value
                         for s in prom.query(substitute(t["expr"], values))} for t in panel["targets"]}


def test_a_partitioned_then_a_frozen_node_are_each_named_by_the_node_lost_alert_and_the_answering_one_never(
        tmp_path: Path) -> None:
    """3x2 job, Prometheus on node0: node1 partitioned, then node2 frozen; FrOtelNodeLost names each with its ranks
    and addresses within 30 s, the lost-hosts table shows node1's, node0 is never named."""
    with Lab(3, log_dir=tmp_path) as lab:
        with _scraped_job(lab, tmp_path, FOR) as (prom, job):
            named_before = _named(prom)  # while the agents started, none had answered yet
            partitioned, after_partition = _fires_for(prom, "node1", lab.partition(1), job.logs())
            named_then = _named(prom)
            rows = _panel_rows(prom, "Lost ranks and hosts")
            frozen, after_freeze = _fires_for(prom, "node2", lab.freeze(2), job.logs())
            named_at_end = _named(prom)
            hosts = {rank: lab.hostnames[job.node_of_rank(rank)] for rank in range(job.world_size)}
    assert hosts == {0: "node0", 1: "node0", 2: "node1", 3: "node1", 4: "node2", 5: "node2"}
    assert named_before == set(), "targets that had never answered were called lost"
    assert after_partition < 30 and after_freeze < 30, (after_partition, after_freeze)
    assert partitioned["labels"]["training_job"] == "lab"
    assert partitioned["annotations"]["summary"] == "Host node1 of training job lab is lost: ranks 2, 3 stopped answering"
    assert "of rank 2 at 10.213.0.2:9740, rank 3 at 10.213.0.2:9741 on host node1," in partitioned["annotations"]["description"]
    assert frozen["annotations"]["summary"] == "Host node2 of training job lab is lost: ranks 4, 5 stopped answering"
    assert "of rank 4 at 10.213.0.3:9740, rank 5 at 10.213.0.3:9741 on host node2," in frozen["annotations"]["description"]
    assert named_then == {"node1"} and named_at_end == {"node1", "node2"}, "the answering node0 was named"
    assert rows["A"] == {("node1", "2"): 1.0, ("node1", "3"): 1.0}  # the host's ranks down: all
    assert rows["B"] == {("node1", "2"): 1.0, ("node1", "3"): 1.0}  # host lost
    assert set(rows["C"]) == {("node1", "2"), ("node1", "3")} and all(0 < s < 60 for s in rows["C"].values())
    assert lab.leftovers() == []


def test_a_crashed_node_is_named_by_the_node_lost_alert_after_the_whole_job_has_exited(tmp_path: Path) -> None:
    """3x2 job, Prometheus on node0: every process of node1 killed mid-training; FrOtelNodeLost names node1 and its
    ranks within 30 s, still names it once every rank has exited, never names node0 or node2, and the lost-hosts
    table marks node1 lost and its silent survivors not."""
    with Lab(3, log_dir=tmp_path) as lab:
        with _scraped_job(lab, tmp_path, CRASH_FOR) as (prom, job):
            crashed_at = lab.crash(1)
            fired, after_crash = _fires_for(prom, "node1", crashed_at, job.logs())
            assert job.wait(60), f"the survivors did not exit: {job.worker_exit_times()}"
            exited = max(job.worker_exit_times().values()) - crashed_at  # type: ignore[operator]
            try:  # Prometheus has seen every agent silent: the job is over for it too
                prom.wait_for("count(rank:fr_agent_up:last_info == 0) == 6", timeout=30)
            except TimeoutError as exc:
                pytest.fail(f"{exc}\n{prom.targets_health()}")
            heard = {s.labels["host"]: s.value - crashed_at for s in prom.query("host:fr_agent_heard:last_timestamp")}
            after = [a for a in prom.api("alerts")["alerts"] if a["labels"]["alertname"] == "FrOtelNodeLost"]
            named = _named(prom, "firing")  # a survivor silent seconds before the others may be pending
            rows = _panel_rows(prom, "Lost ranks and hosts")
    print(f"crash: FrOtelNodeLost fired {after_crash:.1f} s after it, the last rank exited at {exited:.1f} s; "
          f"each host last answered at (s after the crash) {heard}")
    assert after_crash < 30, after_crash
    # After every rank exited: still firing, now saying the rest of the job answered longer, then ended.
    assert [(a["labels"]["host"], a["state"]) for a in after] == [("node1", "firing")], after
    assert "and the rest of training job lab answered up to" in after[0]["annotations"]["description"]
    assert fired["labels"]["training_job"] == "lab"
    assert fired["annotations"]["summary"] == "Host node1 of training job lab is lost: ranks 2, 3 stopped answering"
    assert "of rank 2 at 10.213.0.2:9740, rank 3 at 10.213.0.2:9741 on host node1," in fired["annotations"]["description"]
    assert named == {"node1"}, "a survivor of the crash was named"
    assert rows["B"] == {("node0", "0"): 0.0, ("node0", "1"): 0.0, ("node1", "2"): 1.0, ("node1", "3"): 1.0,
                         ("node2", "4"): 0.0, ("node2", "5"): 0.0}  # host lost: node1 only
    assert lab.leftovers() == []
