"""Every PromQL expression of the dashboards and rules, run on a real Prometheus.

A real Prometheus (Debian's 2.42, started by fr_otel.testing.prometheus on a free loopback port)
loads deploy/prometheus/fr-otel-rules.yml and scrapes one HTTP endpoint per rank serving the
agent's metric contract (OpenMetrics, with a trace_id exemplar on fr_incidents_total). Then:

  (a) every expression of the dashboards (Grafana variables substituted) and of the rules runs
      through /api/v1/query without an error, and every expression that only reads fr-otel data
      returns something for a hung job;
  (b) the key panels and the lag alert's expression name the culprit rank.

The data comes from the ``scenario`` fixture: today a fixed exposition of a 4-rank job in which
rank 2 never enqueued the all_reduce the others wait in. It can be swapped for a real hung gloo job
running the agent: a fixture that yields a ``Scenario`` with that job's scrape targets and its
culprit. ``prometheus_url`` only needs the targets.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_operate_static import (
    CONTRACT_METRICS,
    RULES_FILE,
    alert_rules,
    allow_listed_metrics,
    dashboard_exprs,
    iter_panels,
    load_dashboards,
    metric_names,
    rule_exprs,
    substitute,
    variable_values,
)

from fr_otel.testing.prometheus import PrometheusServer, find_prometheus

TRAINING_JOB = "promql-test"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


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
# the fixed exposition: 4 ranks, rank 2 behind in group "0"
# ------------------------------------------------------------------------------------------------
HOSTS = {0: ("node-a", 0), 1: ("node-a", 1), 2: ("node-b", 0), 3: ("node-b", 1)}


def exposition(rank: int, culprit: int = 2) -> str:
    """The agent's metrics for one rank of a 4-rank job hung in all_reduce #12 of the world group
    ("0"): ranks 0, 1, 3 enqueued #12 and wait in it (ages 300, 299, 298 s); rank `culprit` last
    enqueued #11. Group "1" (ranks 0 and 1) is healthy. OpenMetrics text, as the agent serves it."""
    host, local_rank = HOSTS[rank]
    r = f'rank="{rank}"'
    # (pg_name, pg_desc, enqueued, completed, op in flight or "", age, timeout) as the agent reports them
    groups = [("0", "default_pg", 12, 11, "all_reduce", 300 - rank, 600) if rank != culprit
              else ("0", "default_pg", 11, 11, "", 0, 0)]
    if rank in (0, 1):
        groups.append(("1", "dp_0_1", 5, 5, "", 0, 0))
    incidents = 1 if rank == 0 else 0
    exemplar = f' # {{trace_id="{TRACE_ID}"}} 1.0' if incidents else ""
    lines = ["# TYPE fr_inflight_collective_age_seconds gauge", "# UNIT fr_inflight_collective_age_seconds seconds"]
    lines += [f'fr_inflight_collective_age_seconds{{{r},pg_name="{g}",pg_desc="{d}",op="{op}"}} {age}'
              for g, d, _, _, op, age, _ in groups]
    lines += ["# TYPE fr_inflight_collective_timeout_seconds gauge",
              "# UNIT fr_inflight_collective_timeout_seconds seconds"]
    lines += [f'fr_inflight_collective_timeout_seconds{{{r},pg_name="{g}",pg_desc="{d}",op="{op}"}} {timeout}'
              for g, d, _, _, op, _, timeout in groups]
    lines += ["# TYPE fr_last_enqueued_seq gauge"]
    lines += [f'fr_last_enqueued_seq{{{r},pg_name="{g}",pg_desc="{d}"}} {enq}' for g, d, enq, *_ in groups]
    lines += ["# TYPE fr_last_completed_seq gauge"]
    lines += [f'fr_last_completed_seq{{{r},pg_name="{g}",pg_desc="{d}"}} {done}' for g, d, _, done, *_ in groups]
    lines += [
        "# TYPE fr_incidents counter",
        f"fr_incidents_total{{{r}}} {incidents}{exemplar}",
        "# TYPE fr info",
        (f'fr_info{{{r},local_rank="{local_rank}",host="{host}",torch_version="2.13.0",backend="gloo",'
         f'world_size="4",recorder_capacity="2000"}} 1'),
        "# TYPE fr_agent_polls counter",
        f"fr_agent_polls_total{{{r}}} 120",
        "# TYPE fr_agent_errors counter",
        f"fr_agent_errors_total{{{r}}} 0",
        "# TYPE fr_agent_export_failures counter",
        f"fr_agent_export_failures_total{{{r}}} 0",
        "# TYPE fr_agent_last_poll_timestamp_seconds gauge",
        f"fr_agent_last_poll_timestamp_seconds{{{r}}} {time.time():.3f}",
        "# TYPE fr_recorder_enabled gauge",
        f"fr_recorder_enabled{{{r}}} 1",
        "# EOF",
    ]
    return "\n".join(lines) + "\n"


class _RankHandler(BaseHTTPRequestHandler):
    rank = 0

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        body = exposition(self.rank).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def scenario() -> Iterator[Scenario]:
    """The fixed exposition, one loopback HTTP server per rank (like the agent: base port + rank)."""
    servers = []
    try:
        for rank in HOSTS:
            handler = type(f"Rank{rank}Handler", (_RankHandler,), {"rank": rank})
            server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            servers.append(server)
        yield Scenario(targets=[f"127.0.0.1:{s.server_address[1]}" for s in servers], culprit_rank="2",
                       culprit_group="0", world_size=len(HOSTS), incident_trace_id=TRACE_ID)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


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


@pytest.fixture(scope="module")
def prometheus_url(scenario: Scenario, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus (exemplar storage on) scraping the scenario's targets every second with
    the shipped rules loaded; yields its URL once the rule chain has evaluated on the data."""
    if find_prometheus() is None:
        pytest.fail("prometheus is not installed (scripts/setup-system.sh installs Debian's prometheus)")
    server = PrometheusServer(scenario.targets, job="fr-otel", labels=scenario.labels, scrape_interval="1s",
                              rule_files=[RULES_FILE], workdir=tmp_path_factory.mktemp("prometheus"),
                              startup_timeout=60)
    with server:
        world = len(scenario.targets)
        try:
            # Every rank scraped twice (rate() needs two samples), the blame rule evaluated.
            server.wait_for("rate(fr_agent_polls_total[1m])", lambda r: len(r) == world, timeout=60)
            server.wait_for("rank_pg:fr_behind:lag", timeout=30)
        except TimeoutError as exc:
            pytest.fail(f"{exc}\ntargets: {server.targets_health()}\n{server.log_tail()}")
        yield server.url


# ------------------------------------------------------------------------------------------------
# (a) every expression runs
# ------------------------------------------------------------------------------------------------
DASHBOARDS = load_dashboards()

# fr-otel expressions that are empty on a hung job by design.
EMPTY_BY_DESIGN = {
    "annotation 'fr-otel incidents'",  # > 0 only while the incident counter increases
    "annotation 'fr-otel alerts'",  # ALERTS: nothing has been firing for its `for:` yet
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


def test_lag_alert_expression_names_the_culprit(prometheus_url: str, scenario: Scenario) -> None:
    alerts = {rule["alert"]: rule["expr"] for rule in alert_rules()}
    # The lag alert needs the group to have waited > 60 s: at once for the fixed exposition (300 s),
    # within a minute or so for a live job that is still stuck.
    deadline = time.monotonic() + 90
    while not (lagging := _result(prometheus_url, alerts["FrOtelRankLagging"])):
        assert time.monotonic() < deadline, "FrOtelRankLagging's expression stayed empty"
        time.sleep(1)
    assert [(s["metric"]["rank"], s["metric"]["pg_name"]) for s in lagging] == [
        (scenario.culprit_rank, scenario.culprit_group)]
    oldest = max(float(s["value"][1]) for s in _result(prometheus_url, "pg:fr_inflight_collective_age_seconds:max"))
    stalled = [s["metric"]["pg_name"] for s in _result(prometheus_url, alerts["FrOtelCollectiveStalled"])]
    assert stalled == ([scenario.culprit_group] if oldest > 121 else []) or 119 <= oldest <= 121, (oldest, stalled)
    for healthy in ("FrOtelAgentDown", "FrOtelAgentStale", "FrOtelAgentErroring", "FrOtelExportFailing",
                    "FrOtelRecorderDisabled", "FrOtelCollectiveNearTimeout"):
        assert _result(prometheus_url, alerts[healthy]) == [], healthy


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
    assert {n for n in names if not n.endswith("_created")} == set(CONTRACT_METRICS)
    target_labels = {"job", "instance", *scenario.labels}
    for name, labels in CONTRACT_METRICS.items():
        for s in _result(prometheus_url, name):
            assert set(s["metric"]) - {"__name__"} - target_labels <= labels, name
            assert "rank" in s["metric"], name


def test_prometheus_config_file_is_what_the_test_runs(scenario: Scenario) -> None:
    """The rules the test loads are the shipped ones (not a copy)."""
    assert RULES_FILE == Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "fr-otel-rules.yml"
