"""Every PromQL expression of the dashboards and rules, run on a real Prometheus.

A real Prometheus (Debian's 2.42, started by support.prometheus on a free loopback port)
loads deploy/prometheus/fr-otel-rules.yml as shipped (the stall alerts follow the job's own
threshold, AGENT_STALL_S, which its agents export: the job need not hang a minute), and
scrapes every rank's agent (OpenMetrics, with a trace_id exemplar on fr_incidents_total). Then:

  (a) every expression of the dashboards (Grafana variables substituted) and of the rules runs
      through /api/v1/query without an error, and every expression that only reads fr-otel data
      returns something for a hung job;
  (b) the key panels and the stall alerts' expressions name the culprit rank, the alerts exactly
      while the group has waited past the job's stall threshold and as long again.

The data comes from the ``hung_job`` fixture: a real 4-rank gloo training job under torchrun
with the agent on, in which rank 2 sleeps before an all_reduce the others wait in; Prometheus
scrapes it from its start (``prometheus``); ``scenario`` is that job once the agent's incident
trace has reached a real OTLP receiver (its trace id becomes the exemplar Prometheus stores).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.rules import write_lowered_rules
from support.operate import (
    CONTRACT_METRICS,
    RULES_FILE,
    alert_rules,
    allow_listed_metrics,
    dashboard_exprs,
    iter_panels,
    load_dashboards,
    load_yaml,
    metric_names,
    rule_exprs,
    substitute,
    variable_values,
)

from fr_otel.common.promql import BLAME_FLOOR_S
from fr_otel.scenarios.job import gloo_on_loopback
from fr_otel.testing.otlp import OtlpGrpcReceiver, wait_for
from fr_otel.common.ports import free_port_block
from support.jobs import TRAIN_LOOP
from support.prometheus import PrometheusServer, find_prometheus

pytestmark = pytest.mark.gloo
TRAINING_JOB = "promql-test"


@dataclass
class Scenario:
    """What Prometheus scrapes and what a correct reading of it must find."""

    targets: list[str]  # host:port, one per rank
    culprit_rank: str  # the rank the others wait for
    culprit_group: str  # pg_name of the group waiting for it
    world_size: int
    labels: dict[str, str] = field(default_factory=lambda: {"training_job": TRAINING_JOB})  # target labels
    incident_trace_id: str | None = None  # the trace_id exemplar on fr_incidents_total, if one was exported


# ------------------------------------------------------------------------------------------------
# the data: a real 4-rank gloo training job under torchrun with the agent on; rank 2 stalls
# ------------------------------------------------------------------------------------------------
STALL_RANK, WORLD = 2, 4
#: The agents' stall threshold (--stall-seconds), which they export: the stall alerts hold once the group has
#: waited it and as long again (20 s), past the blame floor (10 s), so the data holds a group behind but not
#: stalled first.
AGENT_STALL_S = 10
STALL_ALERT_AFTER_S = 2 * AGENT_STALL_S
#: Rank 2's sleep: the tests need the stall just past STALL_ALERT_AFTER_S; the rest is slack for a
#: loaded box (the job is killed once the tests are done, so the slack costs no time).
STALL_SECONDS = 90


def _kill_job(proc: subprocess.Popen[bytes], markers: Path) -> None:
    """torchrun's workers may outlive a kill of its session: kill them by their pid markers too."""
    pids = [int(p.read_text()) for p in markers.glob("pid_rank_*") if p.read_text().strip().isdigit()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@dataclass
class HungJob:
    """The running job: its /metrics targets and the OTLP receiver its incident trace goes to."""

    targets: list[str]
    receiver: OtlpGrpcReceiver
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HungJob]:
    """A real hung job: 4 gloo ranks running the agent (metrics on base + LOCAL_RANK, incidents on,
    exported to a real OTLP receiver); rank 2 sleeps before its all_reduce, the others wait in it."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the real hung job needs the torch extra")
    tmp = tmp_path_factory.mktemp("hung-job")
    markers = tmp / "markers"
    base = free_port_block(WORLD)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "OTEL_", "TRAIN_LOOP_"))}
    gloo_on_loopback(env)
    with OtlpGrpcReceiver() as rx:
        env.update(
            OMP_NUM_THREADS="1", TRAIN_LOOP_MARKERS=str(markers), TRAIN_LOOP_AGENT="early",
            TRAIN_LOOP_STALL_RANK=str(STALL_RANK), TRAIN_LOOP_STALL_STEP="5",
            TRAIN_LOOP_STALL_SECONDS=str(STALL_SECONDS), TRAIN_LOOP_STEPS="10",
            TRAIN_LOOP_GLOO_TIMEOUT=str(STALL_SECONDS + 120), FR_OTEL_METRICS_PORT=str(base),
            FR_OTEL_METRICS_ADDR="127.0.0.1", FR_OTEL_POLL_INTERVAL="0.5", FR_OTEL_STALL_SECONDS=str(AGENT_STALL_S),
            FR_OTEL_OUT_DIR=str(tmp / "out"), OTEL_EXPORTER_OTLP_ENDPOINT=rx.url, OTEL_SERVICE_NAME="promql-test",
        )
        log = open(tmp / "job.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
             str(TRAIN_LOOP)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield HungJob([f"127.0.0.1:{base + r}" for r in range(WORLD)], rx, proc, tmp / "job.log")
        finally:
            _kill_job(proc, markers)
            log.close()


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped rules, unchanged (written where the test's Prometheus reads them)."""
    return write_lowered_rules(tmp_path_factory.mktemp("rules"))


@pytest.fixture(scope="module")
def prometheus(hung_job: HungJob, rules_file: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """A real Prometheus (exemplar storage on) scraping every rank each second with the shipped
    rules loaded, from the job's start: it sees every counter from 0, as
    in production."""
    if find_prometheus() is None:
        pytest.fail("prometheus is not installed (scripts/setup-system.sh installs Debian's prometheus)")
    server = PrometheusServer(hung_job.targets, job="fr-otel", labels={"training_job": TRAINING_JOB},
                              scrape_interval="1s", rule_files=[rules_file],
                              workdir=tmp_path_factory.mktemp("prometheus"), startup_timeout=60)
    with server:
        yield server


@pytest.fixture(scope="module")
def scenario(hung_job: HungJob, prometheus: PrometheusServer) -> Scenario:
    """The hung job once its incident trace has arrived (the stall passed the agent's 10 s)."""
    rx, proc = hung_job.receiver, hung_job.proc
    if not wait_for(lambda: len(rx.trace_ids()) == 1 or proc.poll() is not None, timeout=120):
        pytest.fail(f"no incident trace; job log:\n{hung_job.log.read_text(errors='replace')[-3000:]}")
    if not rx.trace_ids():
        pytest.fail(f"the job ended without an incident:\n{hung_job.log.read_text(errors='replace')[-3000:]}")
    return Scenario(targets=hung_job.targets, culprit_rank=str(STALL_RANK), culprit_group="0", world_size=WORLD,
                    incident_trace_id=next(iter(rx.trace_ids())))


# ------------------------------------------------------------------------------------------------
# Prometheus
# ------------------------------------------------------------------------------------------------
def query(url: str, expr: str) -> dict:
    """An instant query; returns Prometheus' JSON answer (status success or error), never raises
    on a query error."""
    req = f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as e:  # 400/422: a bad query, with Prometheus' error body
        return json.load(e)


def _result(url: str, expr: str) -> list[dict]:
    answer = query(url, expr)
    assert answer["status"] == "success", f"{expr}: {answer.get('errorType')}: {answer.get('error')}"
    return answer["data"]["result"]


def _history(url: str, expr: str, start: int, end: int) -> dict[int, list[tuple[dict[str, str], float]]]:
    """Evaluation time -> (labels, value) of each series ``expr`` returned then, each second from
    start to end: a range query, so expressions asked over one range are evaluated at the same instants."""
    req = f"{url}/api/v1/query_range?" + urllib.parse.urlencode({"query": expr, "start": start, "end": end,
                                                                  "step": 1})
    with urllib.request.urlopen(req, timeout=10) as resp:
        answer = json.load(resp)
    assert answer["status"] == "success", f"{expr}: {answer}"
    out: dict[int, list[tuple[dict[str, str], float]]] = {t: [] for t in range(start, end + 1)}
    for series in answer["data"]["result"]:
        for t, value in series["values"]:
            out[int(t)].append((series["metric"], float(value)))
    return out


@pytest.fixture(scope="module")
def prometheus_url(prometheus: PrometheusServer, scenario: Scenario, hung_job: HungJob) -> str:
    """The Prometheus URL once the rule chain has evaluated on the hung job's data."""
    world = len(scenario.targets)
    try:
        # Every rank scraped twice (rate() needs two samples), the blame rule evaluated.
        prometheus.wait_for("rate(fr_agent_polls_total[1m])", lambda r: len(r) == world, timeout=60)
        prometheus.wait_for("rank_pg:fr_behind:lag", timeout=30)
        # The trace proves the agent saw the stall pass its 10 s; Prometheus may still hold the
        # scrape taken just before (1 s interval): wait until it has seen it too, for every waiter.
        prometheus.wait_for(f"count(max by (rank) (fr_inflight_collective_age_seconds) >= 10) >= {world - 1}",
                            timeout=30)
    except TimeoutError as exc:
        pytest.fail(f"{exc}\n{_why_not_scraped(prometheus, hung_job.log)}")
    return prometheus.url


def _why_not_scraped(prometheus: PrometheusServer, job_log: Path) -> str:
    """What a failed wait needs to be understood: each target's health and last error, how many
    scrapes of the last two minutes succeeded and how many poll samples each rank left, the job's log.
    Never raises: a diagnostic must not hide the failure it explains."""
    try:
        lines = [f"target {t.get('scrapeUrl')}: {t.get('health')} {t.get('lastError')!r} "
                 f"(last scrape took {t.get('lastScrapeDuration')} s)" for t in prometheus.targets_health()]
    except Exception as err:  # noqa: BLE001
        lines = [f"targets: (failed: {err})"]
    for expr in ("sum_over_time(up[2m])", "count_over_time(fr_agent_polls_total[2m])",
                 "max_over_time(scrape_duration_seconds[2m])"):
        try:
            rows = prometheus.query(expr)
        except Exception as err:  # noqa: BLE001 - a diagnostic must not hide the failure it explains
            rows, expr = [], f"{expr} (failed: {err})"
        lines.append(f"{expr}: " + ", ".join(f"{r.labels.get('instance')}/{r.labels.get('rank')}={r.value:g}"
                                             for r in rows))
    try:
        job = job_log.read_text(errors="replace")[-3000:]
    except OSError as err:
        job = f"(failed: {err})"
    return "\n".join(lines) + "\n" + prometheus.log_tail() + "\njob log:\n" + job


@pytest.fixture(scope="module")
def stalled_url(prometheus_url: str, prometheus: PrometheusServer, scenario: Scenario) -> str:
    """The Prometheus URL once the culprit's group has waited a few seconds past the stall threshold."""
    oldest = f'pg:fr_inflight_collective_age_seconds:max{{pg_name="{scenario.culprit_group}"}}'
    try:
        prometheus.wait_for(f"{oldest} > {STALL_ALERT_AFTER_S + 6}", timeout=STALL_ALERT_AFTER_S + 30)
    except TimeoutError as exc:
        pytest.fail(f"the group never waited past the stall threshold: {exc}\n{prometheus.log_tail()}")
    return prometheus_url


# ------------------------------------------------------------------------------------------------
# (a) every expression runs
# ------------------------------------------------------------------------------------------------
DASHBOARDS = load_dashboards()

# fr-otel expressions that are empty on a hung job by design.
EMPTY_BY_DESIGN = {
    "annotation 'fr-otel incidents'",  # > 0 only while the incident counter increases
    "annotation 'fr-otel alerts'",  # ALERTS: nothing has been firing for its `for:` yet
    # Ranks whose agent stopped answering: every agent answers here (tests/live/test_lab_prometheus.py).
    "'Lost ranks and hosts' A", "'Lost ranks and hosts' B", "'Lost ranks and hosts' C",
    # When the silent agents of a host last answered, and how long the job went on after them:
    # FrOtelNodeLost's steps, absent while every agent answers (tested on a crash in test_lab_prometheus.py).
    "rule host:fr_agents_down:last_timestamp", "rule host:fr_agents_down:lead_seconds",
    "rule host:fr_silent_early:lead_seconds", "rule host:fr_lost_first:lead_seconds",
    # gloo records no send/recv (tests/operate/test_operate_p2p_promql.py); the abort age only with --on-hang abort.
    "rule peer_pg:fr_stall_threshold:seconds", "rule peer_pg:fr_stall_alert_after:seconds",
    "rule job:fr_abort_after:seconds",
}


def all_expressions(rank: str) -> list[tuple[str, str]]:
    out = []
    for name, dash in sorted(DASHBOARDS.items()):
        values = variable_values(dash, {"rank": rank})
        out += [(f"{name}: {where}", substitute(expr, values)) for where, expr in dashboard_exprs(dash)]
    out += [(f"rule {name}", expr) for name, expr in rule_exprs()]
    return out


def test_every_expression_runs_without_error(prometheus_url: str, scenario: Scenario) -> None:
    errors = []
    for where, expr in all_expressions(scenario.culprit_rank):
        answer = query(prometheus_url, expr)
        if answer["status"] != "success":
            errors.append(f"{where}\n    {expr}\n    {answer.get('errorType')}: {answer.get('error')}")
    assert not errors, "queries Prometheus rejects:\n" + "\n".join(errors)
    assert len(all_expressions(scenario.culprit_rank)) > 80


def test_fr_otel_expressions_return_data_for_a_hung_job(prometheus_url: str, scenario: Scenario) -> None:
    """Semantics, not just syntax: on a hung job every query over fr-otel data shows something.
    Left out: expressions over GPU/host/NIC data (none here) and the alerts (tested below)."""
    infra = allow_listed_metrics() - {"up"}
    infra |= {name for name, expr in rule_exprs() if metric_names(expr) & infra}  # host_gpu:* rules
    # Gloo records no send/recv: p2p series are empty here by design (tests/operate/test_operate_p2p_promql.py).
    infra |= {"fr_inflight_p2p_age_seconds"}
    infra |= {name for name, expr in rule_exprs() if metric_names(expr) & infra}
    alerts = {f"rule {rule['alert']}" for rule in alert_rules()}
    waiting_rank = next(str(r) for r in range(scenario.world_size) if str(r) != scenario.culprit_rank)
    empty = []
    checked = 0
    for where, expr in all_expressions(waiting_rank):
        if metric_names(expr) & infra or where in alerts or any(where.endswith(e) for e in EMPTY_BY_DESIGN):
            continue
        checked += 1
        if not _result(prometheus_url, expr):
            empty.append(f"{where}\n    {expr}")
    assert checked > 40
    assert not empty, "fr-otel expressions empty on a hung job:\n" + "\n".join(empty)


# ------------------------------------------------------------------------------------------------
# (b) the key panels and the lag alert name the culprit
# ------------------------------------------------------------------------------------------------
def _panel(dashboard: str, title: str) -> dict:
    (panel,) = [p for p in iter_panels(DASHBOARDS[dashboard]["panels"]) if p.get("title") == title]
    return panel


def _panel_result(url: str, dashboard: str, title: str, ref: str = "A", rank: str = "0") -> list[dict]:
    panel = _panel(dashboard, title)
    (target,) = [t for t in panel["targets"] if t["refId"] == ref]
    return _result(url, substitute(target["expr"], variable_values(DASHBOARDS[dashboard], {"rank": rank})))


def _ranks(result: list[dict]) -> dict[str, float]:
    return {s["metric"]["rank"]: float(s["value"][1]) for s in result}


def test_who_is_behind_names_the_culprit(prometheus_url: str, scenario: Scenario) -> None:
    title = "Who is behind"
    enqueued = _ranks(_panel_result(prometheus_url, "fr-otel-overview.json", title, "A"))
    assert set(enqueued) == {scenario.culprit_rank} and enqueued[scenario.culprit_rank] >= 1
    waited_for = _panel_result(prometheus_url, "fr-otel-overview.json", title, "D")
    assert [(s["metric"]["rank"], s["metric"]["pg_name"]) for s in waited_for] == [
        (scenario.culprit_rank, scenario.culprit_group)]
    waiting = _ranks(_panel_result(prometheus_url, "fr-otel-overview.json", title, "C"))
    assert waiting[scenario.culprit_rank] >= 10, "the group's wait is shown beside the culprit"
    (ranks_behind,) = _panel_result(prometheus_url, "fr-otel-overview.json", "Ranks behind")
    assert float(ranks_behind["value"][1]) == 1


def test_age_panels_show_the_waiting_ranks_hot_and_the_culprit_cold(prometheus_url: str, scenario: Scenario) -> None:
    ages = _ranks(_panel_result(prometheus_url, "fr-otel-overview.json", "In-flight collective age by rank"))
    assert len(ages) == scenario.world_size
    waiting = [age for rank, age in ages.items() if rank != scenario.culprit_rank]
    assert min(waiting) >= 10, "the waiting ranks heat up"
    assert ages[scenario.culprit_rank] < min(waiting), "the culprit never entered their collective"
    per_group = _panel_result(prometheus_url, "fr-otel-overview.json", "Oldest in-flight collective per group")
    assert {s["metric"]["pg_name"] for s in per_group if float(s["value"][1]) > 0} == {scenario.culprit_group}
    # The rank drill-down of the culprit: it holds up its group; its own age is 0.
    (holds_up,) = _panel_result(prometheus_url, "fr-otel-rank.json", "Groups waiting on it", rank=scenario.culprit_rank)
    assert float(holds_up["value"][1]) == 1
    lags = _panel_result(prometheus_url, "fr-otel-rank.json", "Process groups of rank $rank", "C",
                         rank=scenario.culprit_rank)
    assert {s["metric"]["rank"] for s in lags} == {scenario.culprit_rank}
    assert {s["metric"]["pg_name"]: float(s["value"][1]) for s in lags}[scenario.culprit_group] >= 1


def test_infra_table_puts_the_culprit_on_its_host(prometheus_url: str, scenario: Scenario) -> None:
    rows = _panel_result(prometheus_url, "fr-otel-infra.json", "Ranks, their GPU and what it says", "A")
    by_rank = {s["metric"]["rank"]: s for s in rows}
    assert set(by_rank) == {str(r) for r in range(scenario.world_size)}
    culprit = by_rank[scenario.culprit_rank]
    assert float(culprit["value"][1]) >= 1 and culprit["metric"]["host"] and culprit["metric"]["gpu"]
    assert all(float(s["value"][1]) == 0 for r, s in by_rank.items() if r != scenario.culprit_rank)


def test_lag_alert_expression_names_the_culprit(stalled_url: str, scenario: Scenario) -> None:
    """Past the stall threshold, FrOtelRankLagging's expression names rank 2 in group 0, alone, and
    the agent-health and near-timeout alerts hold for nobody."""
    alerts = {rule["alert"]: rule["expr"] for rule in alert_rules()}
    lagging = _result(stalled_url, alerts["FrOtelRankLagging"])
    assert [(s["metric"]["rank"], s["metric"]["pg_name"]) for s in lagging] == [
        (scenario.culprit_rank, scenario.culprit_group)]
    for healthy in ("FrOtelAgentDown", "FrOtelAgentStale", "FrOtelAgentErroring", "FrOtelExportFailing",
                    "FrOtelRecorderDisabled", "FrOtelCollectiveNearTimeout"):
        assert _result(stalled_url, alerts[healthy]) == [], healthy


def test_stall_alerts_hold_exactly_while_the_group_has_waited_past_the_stall_threshold(
        stalled_url: str, scenario: Scenario) -> None:
    """Second by second over the hang, FrOtelCollectiveStalled and FrOtelRankLagging hold exactly
    while the group's oldest collective is older than the job's own stall threshold (its agents' 10 s) and as
    long again: never while the culprit is merely behind (past the blame floor, named by rank_pg:fr_behind:lag),
    always after."""
    (threshold,) = _result(stalled_url, "job:fr_stall_threshold:seconds")
    assert float(threshold["value"][1]) == AGENT_STALL_S, "the job's threshold, from its agents"
    alerts = {rule["alert"]: rule["expr"] for rule in alert_rules()}
    end = int(time.time()) - 1
    start = end - 150  # the job's start is within: the fixtures wait at most ~50 s past the stall's

    def history(expr: str) -> dict[int, list[tuple[str, ...]]]:
        rows = _history(stalled_url, expr, start, end)
        return {t: sorted(tuple(m.get(k, "") for k in ("rank", "pg_name")) for m, _ in got) for t, got in rows.items()}

    group, rank = scenario.culprit_group, scenario.culprit_rank
    ages = {t: max((v for m, v in rows if m["pg_name"] == group), default=None)
            for t, rows in _history(stalled_url, "pg:fr_inflight_collective_age_seconds:max", start, end).items()}
    stalled, lagging = history(alerts["FrOtelCollectiveStalled"]), history(alerts["FrOtelRankLagging"])
    behind = history("rank_pg:fr_behind:lag")
    wrong, only_behind, past = [], 0, 0
    for t, age in sorted(ages.items()):
        if age is None:
            continue
        is_stalled = age > STALL_ALERT_AFTER_S
        want = ([("", group)], [(rank, group)]) if is_stalled else ([], [])
        if (stalled[t], lagging[t]) != want:
            wrong.append(f"t={t} age={age:.1f}: stalled {stalled[t]}, lagging {lagging[t]}")
        if not is_stalled and age >= BLAME_FLOOR_S:
            only_behind += 1
            assert behind[t] == [(rank, group)], f"t={t} age={age:.1f}: behind {behind[t]}"
        past += is_stalled
    assert not wrong, "stall alerts out of step with the threshold:\n" + "\n".join(wrong)
    assert only_behind >= 3 and past >= 3, (only_behind, past)


def test_incident_exemplar_reaches_prometheus(prometheus_url: str, scenario: Scenario) -> None:
    if scenario.incident_trace_id is None:
        pytest.skip("this scenario exported no incident")
    now = time.time()
    req = f"{prometheus_url}/api/v1/query_exemplars?" + urllib.parse.urlencode(
        {"query": "fr_incidents_total", "start": now - 600, "end": now + 60})
    with urllib.request.urlopen(req, timeout=10) as resp:
        answer = json.load(resp)
    assert answer["status"] == "success"
    trace_ids = {e["labels"].get("trace_id") for s in answer["data"] for e in s["exemplars"]}
    assert trace_ids == {scenario.incident_trace_id}


def test_the_exposition_is_the_contract(prometheus_url: str, scenario: Scenario) -> None:
    """Keep the data honest: Prometheus sees exactly the contract's metrics, with its labels
    (OpenMetrics counters' `_created` series aside)."""
    names = {s["metric"]["__name__"] for s in _result(prometheus_url, '{job="fr-otel", __name__=~"fr_.*"}')}
    # Gloo records no send/recv: the p2p series are checked in tests/operate/test_operate_p2p_promql.py.
    served = {n for n in names if not n.endswith("_created")}
    absent = {"fr_inflight_p2p_age_seconds", "fr_exclude_host", "fr_abort_after_seconds"}  # no p2p, verdict, abort
    assert set(CONTRACT_METRICS) - absent <= served <= set(CONTRACT_METRICS)
    target_labels = {"job", "instance", *scenario.labels}
    for name, labels in CONTRACT_METRICS.items():
        for s in _result(prometheus_url, name):
            assert set(s["metric"]) - {"__name__"} - target_labels <= labels, name
            assert "rank" in s["metric"], name


def test_the_rules_prometheus_runs_are_the_shipped_ones(rules_file: Path) -> None:
    """The rules loaded here are deploy/prometheus/fr-otel-rules.yml, unchanged (everything the other tests judge
    is the shipped rules)."""
    assert load_yaml(rules_file) == load_yaml(RULES_FILE)


# ------------------------------------------------------------------------------------------------
# (c) job-level things are counted once per job, whatever the world size
# ------------------------------------------------------------------------------------------------
#: Every panel, annotation and rule that counts job-level things (incidents, stalled groups, ranks
#: behind), with what it must show for the scenario: one hung job with one incident, one stalled
#: group and one rank behind, on 4 ranks. (dashboard or None for a rule, title, refId, value,
#: overrides of dashboard variables.) "Groups stalled" counts against the loaded (lowered) threshold.
JOB_LEVEL = [
    ("fr-otel-overview.json", "Incidents in range", "A", 1, {}),
    ("fr-otel-overview.json", "Incidents (exemplars open the trace)", "A", 1, {"__rate_interval": "10m"}),
    ("fr-otel-overview.json", "annotation 'fr-otel incidents'", None, 1, {"__rate_interval": "10m"}),
    ("fr-otel-infra.json", "annotation 'fr-otel incidents'", None, 1, {"__rate_interval": "10m"}),
    ("fr-otel-rank.json", "annotation 'fr-otel incidents'", None, 1, {"__rate_interval": "10m"}),
    ("fr-otel-rank.json", "Incidents in range", "A", 1, {}),
    ("fr-otel-overview.json", "Ranks behind", "A", 1, {}),
    ("fr-otel-overview.json", "Ranks behind, per group", "A", 1, {}),
    ("fr-otel-overview.json", "Groups stalled", "A", 1, {}),
    ("fr-otel-infra.json", "Ranks the others wait for, per host", "A", 1, {}),
    ("fr-otel-rank.json", "Groups waiting on it", "A", 1, {}),
    (None, "job:fr_ranks_behind:count", None, 1, {}),
]


def _job_level_expr(dashboard: str | None, title: str, ref: str | None, overrides: dict[str, str], rank: str) -> str:
    if dashboard is None:
        return dict(rule_exprs())[title]
    values = variable_values(DASHBOARDS[dashboard], {"rank": rank, **overrides})
    if ref is None:
        (expr,) = [e for where, e in dashboard_exprs(DASHBOARDS[dashboard]) if where == title]
    else:
        (target,) = [t for t in _panel(dashboard, title)["targets"] if t["refId"] == ref]
        expr = target["expr"]
    return substitute(expr, values)


def test_job_level_panels_count_each_thing_once_per_job(stalled_url: str, scenario: Scenario) -> None:
    """On the real 4-rank hang: one incident shows as 1 (every rank counts it in its own
    fr_incidents_total, so a sum would show 4), one stalled group as 1, one rank behind as 1."""
    assert scenario.world_size > 1
    incidents = "count(fr_incidents_total >= 1)"
    deadline = time.monotonic() + 30
    while not ((r := _result(stalled_url, incidents)) and float(r[0]["value"][1]) == scenario.world_size):
        assert time.monotonic() < deadline, f"not every rank counted the incident: {r}"
        time.sleep(1)
    (naive,) = _result(stalled_url, "sum(fr_incidents_total)")
    assert float(naive["value"][1]) == scenario.world_size, "each rank counts the incident: a sum is wrong"
    wrong = []
    for dashboard, title, ref, expected, overrides in JOB_LEVEL:
        expr = _job_level_expr(dashboard, title, ref, overrides, scenario.culprit_rank)
        rows = _result(stalled_url, expr)
        values = [float(s["value"][1]) for s in rows]
        if len(values) != 1 or not expected <= values[0] < expected + 0.5:
            wrong.append(f"{dashboard}: {title} {ref or ''}\n    {expr}\n    {values} (expected one row, {expected})")
    assert not wrong, "job-level counts that are not per job:\n" + "\n".join(wrong)
