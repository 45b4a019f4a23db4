"""A slow host, live: 3 lab hosts x 2 gloo ranks under ``fr-otel run``; node1 throttled by a cgroup CPU
quota. The shipped alerts (on a real Prometheus inside the lab) and the agent's log name node1 and
its two ranks within a minute, and nothing else; before that, healthy half a minute (three of the lowered
rules' 10 s `for` windows) raises nothing. That healthy hours raise nothing at the shipped thresholds is
promtool's to hold (tests/operate/test_operate_static.py), not a live minute's."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
from pathlib import Path

import pytest
from support.lab import Lab, lab_unavailable
from support.lab_job import LabJob, fr_otel_run
from support.lab_prometheus import LabPrometheus
from support.rules import EVERY_ALERT, write_lowered_rules

from fr_otel.testing.otlp import wait_for
from support.prometheus import find_prometheus

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.lab,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
    pytest.mark.skipif(bool(lab_unavailable()), reason=lab_unavailable() or ""),
    pytest.mark.skipif(find_prometheus() is None, reason="needs Debian's prometheus (scripts/setup-system.sh)"),
]

TRAIN_LOOP = Path(importlib.util.find_spec("support.train_loop").origin)  # type: ignore[union-attr,arg-type]
HEALTHY_S = 30.0
SLOW_NODE, CPU_FRACTION = 1, 0.05  # node1's processes together get 5 % of one CPU: the job runs ~4x slower
NAMED_WITHIN_S = 60.0
SLOW_ALERTS = "FrOtelSlow.*"
HELD_UP = re.compile(r"fr-otel\[rank (\d+)\]: (.*) has held up (.*)")
WHOLE_HOST = "node1 (ranks 2-3)"


def _env(out: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "OTEL_", "TRAIN_LOOP_"))}
    env.update(OMP_NUM_THREADS="1", TRAIN_LOOP_STEPS="100000", TRAIN_LOOP_GLOO_TIMEOUT="120",
               FR_OTEL_OUT_DIR=str(out / "{node}"), FR_OTEL_LOG_LEVEL="info")
    return env


def _held_up_lines(lab: Lab) -> list[tuple[str, str, str, str]]:
    """(host whose log, rank, who, the rest) of every slow-host line in every host's log."""
    out = []
    for proc in lab.processes:
        for line in proc.output().splitlines():
            m = HELD_UP.search(line)
            if m:
                out.append((lab.hostnames[proc.node], m.group(1), m.group(2), m.group(3)))
    return out


def _slow_history(prom: LabPrometheus, slowed: float) -> str:
    """What the rules saw since the throttle (monotonic ``slowed``), every 5 s: each rank's and host's lateness,
    the slow alerts' states."""
    since = time.time() - (time.monotonic() - slowed)
    return "\n".join(prom.history(expr, since) for expr in (
        "rank_pg:fr_lateness:ratio", "host_pg:fr_lateness:ratio", "host_pg:fr_collectives_completed:rate",
        'ALERTS{alertname=~"FrOtelSlow.*"}'))


class _StepRate:
    """Steps per second of the slowest rank (by its step markers) from now until :meth:`rate` is read."""

    def __init__(self, job: LabJob) -> None:
        self.job = job
        self.first, self.began = min(s.step for s in job.steps().values()), time.monotonic()

    def rate(self, at_least_s: float = 15.0) -> float:
        """The rate since construction, over ``at_least_s`` s at least (sleeping for the rest if needed)."""
        time.sleep(max(0.0, at_least_s - (time.monotonic() - self.began)))
        return (min(s.step for s in self.job.steps().values()) - self.first) / (time.monotonic() - self.began)


def test_a_throttled_host_is_named_by_the_alerts_and_the_log_within_a_minute_and_a_healthy_job_raises_nothing(
        tmp_path: Path) -> None:
    """Healthy half a minute: no slow alert, no line. Then node1 at 5 % of a CPU (the job >= 1.3x slower):
    within 60 s FrOtelSlowHost names node1, FrOtelSlowRank ranks 2 and 3 only, rank 0's agent logs a line
    naming node1 (ranks 2-3) and no other host or rank (under load one of the two may cross the threshold, and
    get a line of its own, first), and the incident it raises gets the offline verdict, stragglers 2 and 3,
    and its trace id is the exemplar on the ranks' wait counters."""
    out = tmp_path / "out"
    with Lab(3, log_dir=tmp_path) as lab:
        job = lab.torchrun(TRAIN_LOOP, 2, _env(out), wrap=fr_otel_run())
        targets = [f"{ip}:{9740 + local}" for ip in lab.ips for local in range(2)]
        job.wait_step(10, timeout=180)
        with LabPrometheus(lab, 0, targets, scrape_interval="2s", rule_files=[write_lowered_rules(tmp_path, fors={EVERY_ALERT: "10s"})],
                           workdir=tmp_path / "prometheus", startup_timeout=60) as prom:
            prom.wait_for_targets(up=6, timeout=60)
            began = time.monotonic()
            healthy = _StepRate(job)  # over the healthy minutes themselves
            lateness = 0.0
            while time.monotonic() - began < HEALTHY_S:
                assert prom.firing(SLOW_ALERTS) == [], "a slow alert on a healthy job"
                lateness = max([lateness, *(s.value for s in prom.query("max(rank_pg:fr_lateness:ratio)"))])
                time.sleep(2)
            assert _held_up_lines(lab) == []
            healthy_rate = healthy.rate()

            slowed = time.monotonic()
            lab.slow(SLOW_NODE, CPU_FRACTION)
            slow = _StepRate(job)  # from the throttle on, while the alerts and the log name it
            alerted = logged = None
            while (alerted is None or logged is None) and time.monotonic() - slowed < NAMED_WITHIN_S:
                if alerted is None and any(a["alertname"] == "FrOtelSlowHost" for a in prom.firing(SLOW_ALERTS)):
                    alerted = time.monotonic() - slowed
                if logged is None and _held_up_lines(lab):
                    logged = time.monotonic() - slowed
                time.sleep(1)
            assert alerted is not None and logged is not None, (
                f"not named within {NAMED_WITHIN_S:g} s (alert after {alerted} s, log line after {logged} s): alerts "
                f"{prom.firing(SLOW_ALERTS)}, log {_held_up_lines(lab)}\n{_slow_history(prom, slowed)}\n{job.logs()}")
            slow_rate = slow.rate()
            wait_for(lambda: len(prom.firing("FrOtelSlowRank")) >= 2, 15, 1.0)
            alerts = prom.firing(SLOW_ALERTS)
            assert wait_for(lambda: list(out.glob("node0/dumps/*/incident.json")), 60, 0.5), job.logs()
            incident = json.loads(next(out.glob("node0/dumps/*/incident.json")).read_text())

            def exemplar_traces() -> set[str]:
                found = prom.exemplars("fr_collective_wait_seconds_total", time.time() - 600, time.time() + 60)
                return {e.labels.get("trace_id", "") for e in found}

            wait_for(lambda: incident["trace_id"] in exemplar_traces(), 20, 1.0)
            traces = exemplar_traces()
            wait_for(lambda: WHOLE_HOST in [who for _, _, who, _ in _held_up_lines(lab)], 60, 1.0)
        lines = _held_up_lines(lab)
    print(f"healthy: {healthy_rate:.1f} steps/s, max lateness {lateness:.3f}; slowed: {slow_rate:.1f} steps/s; "
          f"FrOtelSlowHost after {alerted:.0f} s, the log line after {logged:.0f} s")
    assert healthy_rate >= 1.3 * slow_rate, "the quota did not slow the job enough to test anything"
    assert {(a["alertname"], a.get("host"), a.get("rank")) for a in alerts} == {
        ("FrOtelSlowHost", "node1", None), ("FrOtelSlowRank", "node1", "2"), ("FrOtelSlowRank", "node1", "3")}
    said = [(host, rank, who) for host, rank, who, _ in lines]
    assert ("node0", "0", WHOLE_HOST) in said and len(said) == len(set(said)), lines  # each said once
    assert {s for s in said if s[2] != WHOLE_HOST} <= {("node0", "0", "rank 2 (node1)"), ("node0", "0", "rank 3 (node1)")}, lines
    summary = incident["summary"]
    assert summary["verdict"] == "straggler", json.dumps(summary, indent=1)[:6000]
    assert {c["rank"] for c in summary["culprits"]} == {2, 3}, summary["culprits"]
    assert traces == {incident["trace_id"]}, "the wait counters' exemplar is the slow host's incident trace"
    assert summary["exclude_hosts"] == []  # a straggler's host is slow, not one to leave out
