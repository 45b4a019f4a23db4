"""Static checks of the operations side: rules, dashboards, deploy configs, docs.

No Docker engine, Grafana, Tempo, Jaeger or Collector binary exists here, so everything they would
load is checked statically: promtool (rules, rule unit tests, config), amtool, a strict dashboard
lint, collector pipeline wiring, compose/Kubernetes/Slurm files, the generated Kubernetes output and
the runbook links. tests/operate/test_operate_promql.py runs every PromQL expression on a real Prometheus.

The helpers (expressions of the dashboards and rules, Grafana variable substitution, metric names
in PromQL) live in tests/support/operate.py, shared with the tests that run a real Prometheus.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml
from support.operate import (
    ARCHITECTURE,
    COMPOSE_DIR,
    CONTRACT_METRICS,
    DASHBOARD_DIR,
    DASHBOARD_FILES,
    DEPLOY,
    K8S_DIR,
    PROM_DIR,
    RULES_PACE_TEST_FILE,
    RULES_TEST_FILE,
    RUNBOOK,
    RUNBOOK_URL,
    SLURM_DIR,
    alert_rules,
    allow_listed_metrics,
    dashboard_exprs,
    github_anchors,
    iter_panels,
    load_dashboards,
    load_rules,
    load_yaml,
    load_yaml_all,
    metric_names,
    need,
    recorded_names,
    rule_exprs,
    run,
    substitute,
    variable_values,
)
from support.rules import RULES_FILE, write_lowered_rules

from fr_otel.trace import attributes



# ----------------------------------------------------------------------------------------------
# the helpers themselves
# ----------------------------------------------------------------------------------------------
def test_metric_name_tokenizer() -> None:
    assert metric_names('sum by (job) (rate(fr_agent_errors_total{job=~"$job"}[$__rate_interval]))') == {
        "fr_agent_errors_total"}
    assert metric_names("pg:fr_last_enqueued_seq:max - on(job, pg_name) group_right() fr_last_enqueued_seq") == {
        "pg:fr_last_enqueued_seq:max", "fr_last_enqueued_seq"}
    assert metric_names('(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL * 1e6) or DCGM_FI_DEV_X and on(host) up > 0.8') == {
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_X", "up"}
    assert metric_names('label_replace(fr_info, "gpu", "$1", "local_rank", "(.*)")') == {"fr_info"}
    assert metric_names("time() - fr_agent_last_poll_timestamp_seconds > 60 or vector(0)") == {
        "fr_agent_last_poll_timestamp_seconds"}


def test_substitution() -> None:
    values = {"job": ".*", "rank": "2", "__rate_interval": "1m"}
    assert substitute('x{job=~"$job",rank="${rank}"}[$__rate_interval]', values) == 'x{job=~".*",rank="2"}[1m]'
    assert substitute('label_replace(x, "a", "$1", "b", "(.*)")', values) == 'label_replace(x, "a", "$1", "b", "(.*)")'
    with pytest.raises(KeyError):
        substitute("x{a=\"$nope\"}", values)


# ----------------------------------------------------------------------------------------------
# Prometheus rules and config
# ----------------------------------------------------------------------------------------------
def test_promtool_check_rules() -> None:
    result = run([need("promtool"), "check", "rules", str(RULES_FILE)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_test_rules() -> None:
    result = run([need("promtool"), "test", "rules", RULES_TEST_FILE.name], cwd=PROM_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_stall_alerts_keep_each_jobs_own_threshold_at_their_groups_pace() -> None:
    """rules-pace.test.yml: with an 8 s threshold the stall alerts fire 25 s into the stall, with 60 s at 2m10s."""
    result = run([need("promtool"), "test", "rules", RULES_PACE_TEST_FILE.name], cwd=PROM_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_check_config() -> None:
    result = run([need("promtool"), "check", "config", str(PROM_DIR / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout
    config = load_yaml(PROM_DIR / "prometheus.yml")
    assert config["rule_files"] == ["fr-otel-rules.yml"]
    assert config["alerting"]["alertmanagers"][0]["file_sd_configs"][0]["files"] == ["targets/alertmanager*.json"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["fr-otel"]["file_sd_configs"][0]["files"], "agent targets come from file_sd"
    assert {"fr-otel", "dcgm", "node"} <= set(jobs)


def test_the_shipped_prometheus_config_scrapes_the_demo_and_finds_alertmanager_without_edits() -> None:
    """As shipped, prometheus.yml scrapes `fr-otel demo`'s default ports and sends to an Alertmanager on this
    machine; deploy/compose's targets send to its alertmanager service instead."""
    from fr_otel.demo.job import DEFAULT_METRICS_PORT, DemoPlan

    config = load_yaml(PROM_DIR / "prometheus.yml")
    (demo,) = [job for job in config["scrape_configs"] if job["job_name"] == "fr-otel-demo"]
    (static,) = demo["static_configs"]
    world = DemoPlan.__dataclass_fields__["world_size"].default
    assert static["targets"] == [f"127.0.0.1:{DEFAULT_METRICS_PORT + r}" for r in range(world)]  # type: ignore[operator]
    assert load_yaml(PROM_DIR / "targets" / "alertmanager.json") == [{"targets": ["localhost:9093"]}]
    assert load_yaml(COMPOSE_DIR / "targets" / "alertmanager.json") == [{"targets": ["alertmanager:9093"]}]


@pytest.mark.parametrize("path", sorted((PROM_DIR / "targets" / "examples").glob("*.json"))
                         + sorted((COMPOSE_DIR / "targets").glob("*.json")), ids=lambda p: p.name)
def test_file_sd_examples(path: Path) -> None:
    check_file_sd(json.loads(path.read_text(encoding="utf-8")))


def check_file_sd(groups: Any) -> None:
    assert isinstance(groups, list) and groups
    for group in groups:
        assert set(group) <= {"targets", "labels"}
        assert group["targets"] and all(re.fullmatch(r"[\w.\-]+:\d+", t) for t in group["targets"]), group
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in group.get("labels", {}).items())


def test_amtool_check_config() -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool not installed (Debian package prometheus-alertmanager)")
    result = run([amtool, "check-config", str(PROM_DIR / "alertmanager.yml")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_conventions() -> None:
    header = RULES_FILE.read_text(encoding="utf-8").split("groups:", 1)[0]
    anchors = github_anchors(RUNBOOK.read_text(encoding="utf-8"))
    alerts = alert_rules()
    assert len(alerts) >= 7
    names = [rule["alert"] for rule in alerts]
    assert len(names) == len(set(names)), "alert names must be unique"
    for rule in alerts:
        name = rule["alert"]
        assert re.fullmatch(r"FrOtel[A-Z][A-Za-z]+", name), f"{name}: CamelCase with the FrOtel prefix"
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: needs a for:"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        ann = rule["annotations"]
        assert set(ann) == {"summary", "description", "runbook_url"}, name
        assert "{{" in ann["description"] and "$labels" in ann["description"], f"{name}: templated description"
        assert ann["runbook_url"] == RUNBOOK_URL + name.lower(), f"{name}: runbook_url {ann['runbook_url']}"
        assert name.lower() in anchors, f"{name}: no section {name} in docs/runbook.md"
        assert name in header, f"{name}: threshold not documented in the rules file header"
    # The alerts that say a collective is near its timeout, stalled, or a rank lags.
    exprs = {rule["alert"]: rule["expr"] for rule in alerts}
    assert "fr_inflight_collective_timeout" in exprs["FrOtelCollectiveNearTimeout"]
    assert exprs["FrOtelCollectiveStalled"].strip().startswith("pg:fr_inflight_collective_age_seconds:max >")
    assert "rank_pg:fr_behind:lag" in exprs["FrOtelRankLagging"]
    assert re.search(r'up\{job="fr-otel"\} == 0', exprs["FrOtelAgentDown"])
    assert "fr_agent_export_failures_total" in exprs["FrOtelExportFailing"]
    assert "fr_agent_errors_total" in exprs["FrOtelAgentErroring"]
    lagging = next(rule for rule in alerts if rule["alert"] == "FrOtelRankLagging")
    assert "$labels.rank" in lagging["annotations"]["summary"], "the lag alert names the rank"


def test_recording_rule_names() -> None:
    for name in recorded_names():
        assert re.fullmatch(r"[a-z_]+:[a-z][a-z0-9_]*:[a-z_]+", name), f"{name}: level:metric:operations"


THRESHOLD_PREFIX = "threshold:"
BLAME_FLOOR = "threshold:fr_blame_floor:seconds"


def threshold_rules() -> dict[str, str]:
    """The threshold recording rules: name -> its constant (``vector(N)``)."""
    return {rule["record"]: rule["expr"] for rule in load_rules()
            if rule.get("record", "").startswith(THRESHOLD_PREFIX)}


def thresholds_read(expr: str, thresholds: Iterable[str]) -> set[str]:
    """The thresholds an expression compares against: named in it, or in a recording rule it reads
    (and so on), so a rule recording a comparison is the one place of it and its alert still says."""
    records = {rule["record"]: rule["expr"] for rule in load_rules() if "record" in rule}
    seen: set[str] = set()
    todo = [expr]
    while todo:
        for name in metric_names(todo.pop()) & set(records) - seen:
            seen.add(name)
            todo.append(records[name])
    return {t for t in thresholds if t in expr or t in seen}


def test_alert_thresholds_have_one_source_and_annotations_read_it() -> None:
    """Every threshold is one constant recording rule; alerts compare against it (or read the rule
    that does) and their annotations print it through a query (no number written twice), and name
    the training job."""
    thresholds = threshold_rules()
    assert len(thresholds) >= 5
    for name, expr in thresholds.items():
        assert re.fullmatch(r"vector\(\d+(\.\d+)?\)", expr.strip()), f"{name}: a constant, vector(N)"
    used: set[str] = set()
    for rule in alert_rules():
        name, expr, ann = rule["alert"], rule["expr"], rule["annotations"]
        text = ann["summary"] + " " + ann["description"]
        assert "$labels.training_job" in ann["summary"] and "$labels.training_job" in ann["description"], name
        read = thresholds_read(expr, thresholds) - {BLAME_FLOOR}  # who is behind, not when an alert fires
        used |= read
        # Printed as is, or through the recorded rule that reads it (the stall alerts print their job's threshold).
        printed = {r for r in recorded_names() if re.search(rf"(query `|printf `){re.escape(r)}\b", text)}
        for t in read:
            assert f"query `{t}`" in text or any(t in thresholds_read(r, [t]) for r in printed), \
                f"{name}: its annotations do not print {t}"
        # No literal threshold in the text: numbers only through templates.
        outside = re.sub(r"\{\{.*?\}\}", " ", text)
        assert not re.search(r"\d+\s*(s|m|%|seconds|minutes)\b", outside), f"{name}: a hard-coded number: {outside}"
        nonzero = re.search(r"[><]=?\s*(?!0(?![.\d]))\d", expr)  # "> 0" / "== 0" are no thresholds
        assert not nonzero, f"{name}: compare against a threshold:* series, not a number"
    assert used == set(thresholds) - {BLAME_FLOOR}


def test_alerts_on_recorded_series_are_evaluated_after_them_in_one_group() -> None:
    """Prometheus runs a group's rules in order at one timestamp: an alert that reads a recorded
    series (thresholds aside: constants) sits in that series' group, after it, so its value is
    current within one evaluation interval instead of lagging a chain of groups."""
    groups = load_yaml(RULES_FILE)["groups"]
    where: dict[str, tuple[str, int]] = {}
    for group in groups:
        for i, rule in enumerate(group["rules"]):
            if "record" in rule:
                where[rule["record"]] = (group["name"], i)
    checked = 0
    for group in groups:
        for i, rule in enumerate(group["rules"]):
            for name in metric_names(rule["expr"]) & set(where):
                if name.startswith(THRESHOLD_PREFIX):
                    continue
                checked += 1
                assert where[name][0] == group["name"] and where[name][1] < i, \
                    f"{rule.get('alert') or rule.get('record')} reads {name} from group {where[name][0]}"
    assert checked >= 10


LOWERED = {"threshold:fr_collective_stalled:seconds": "30", "threshold:fr_collective_near_timeout:ratio": "0.5",
           "threshold:fr_agent_stale:seconds": "30", "threshold:fr_blame_floor:seconds": "5",
           "threshold:fr_node_lost:ratio": "0.5"}


def _lowered_rules_test() -> dict:
    """A promtool test of the rules with LOWERED thresholds: each alert fires where only the lower
    threshold makes it fire, and its annotation prints the lowered value. Ages grow 15 s per 15 s
    step (age = evaluation time), timeouts are 600 s."""
    def series(name: str, values: str, rank: str, **labels: str) -> dict:
        base = {"job": "fr-otel", "training_job": "llama-7b", "instance": f"node-a:{9740 + int(rank)}", "rank": rank,
                **labels}
        return {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in base.items()) + "}", "values": values}

    group = {"pg_name": "0", "pg_desc": "default_pg"}
    inputs = []
    for rank in "0123":
        stuck = rank != "2"
        inputs.append(series("fr_last_enqueued_seq", "100x40" if stuck else "99x40", rank, **group))
        inputs.append(series("fr_inflight_collective_age_seconds", "0+15x40" if stuck else "0x40", rank, **group))
        inputs.append(series("fr_inflight_collective_timeout_seconds", "600x40" if stuck else "0x40", rank, **group))
    inputs.append(series("fr_agent_last_poll_timestamp_seconds", "0+15x10 150x30", "1"))
    # A pipeline group: rank 1 waits in its send to rank 2, which waits in no send/recv.
    pipe = {"pg_name": "43", "pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP"}
    inputs.append(series("fr_inflight_p2p_age_seconds", "0+15x40", "1", **pipe, op="send", peer="2"))
    # Host node-x: rank 11's agent stops answering at 1m, rank 10's answers; node-y's rank 12 too.
    for rank, host, up in (("10", "node-x", "1x40"), ("11", "node-x", "1x3 0x36"), ("12", "node-y", "1x40")):
        inputs.append(series("up", up, rank, instance=f"{host}:{9740 + int(rank)}"))
        inputs.append(series("fr_info", up.replace(" 0x36", " stale"), rank, instance=f"{host}:{9740 + int(rank)}",
                             local_rank=str(int(rank) % 2), host=host))
    pg_labels = {"severity": "warning", "job": "fr-otel", "training_job": "llama-7b", **group}
    url = RUNBOOK_URL

    def case(t: str, alert: str, expected: list[dict]) -> dict:
        return {"eval_time": t, "alertname": alert, "exp_alerts": expected}

    return {
        "rule_files": ["fr-otel-rules.yml"],
        "evaluation_interval": "15s",
        "group_eval_order": [g["name"] for g in load_yaml(RULES_FILE)["groups"]],
        "tests": [{
            "name": "lowered thresholds fire earlier and say so",
            "interval": "15s",
            "input_series": inputs,
            "alert_rule_test": [
                # age > 30 + 30 from 1m15s, for 5s: firing from 1m30s (the shipped 60 s: past 2m).
                case("1m15s", "FrOtelCollectiveStalled", []),
                case("2m", "FrOtelCollectiveStalled", [{"exp_labels": pg_labels, "exp_annotations": {
                    "summary": "A collective has been in flight for over 30s in group 0 of training job llama-7b",
                    "description": "The oldest in-flight collective of process group 0 (default_pg) in training job "
                                   "llama-7b has waited 2m 0s (threshold 30s). Its members are blocked; see "
                                   "FrOtelRankLagging for the rank(s) they wait for.",
                    "runbook_url": url + "frotelcollectivestalled"}}]),
                # The same threshold, the same times: one meaning of stalled.
                case("1m15s", "FrOtelRankLagging", []),
                case("2m", "FrOtelRankLagging", [{
                    "exp_labels": {**pg_labels, "instance": "node-a:9742", "rank": "2"}, "exp_annotations": {
                    "summary": "Rank 2 is holding up process group 0 of training job llama-7b",
                    "description": "Rank 2 (node-a:9742) of training job llama-7b has enqueued 1 collective(s) fewer "
                                   "than the most advanced member of process group 0 (default_pg), whose other "
                                   "members have waited over 30s: they are waiting for rank 2.",
                    "runbook_url": url + "frotelranklagging"}}]),
                case("1m15s", "FrOtelSendRecvStalled", []),
                case("2m", "FrOtelSendRecvStalled", [{
                    "exp_labels": {**pg_labels, **pipe, "peer": "2"}, "exp_annotations": {
                    "summary": "Rank 2 is holding up send/recv in group 43 of training job llama-7b",
                    "description": "Ranks of process group 43 (PIPELINE_MODEL_PARALLEL_GROUP) in training job "
                                   "llama-7b have waited 2m 0s in send/recv on rank 2, which is not itself waiting "
                                   "in a send/recv (threshold 30s): it never posted the matching op, or it is stuck "
                                   "elsewhere.",
                    "runbook_url": url + "frotelsendrecvstalled"}}]),
                # age / 600 > 0.5 from 5m15s, for 30s: firing from 5m45s (the shipped 80 %: from 8m45s).
                case("5m30s", "FrOtelCollectiveNearTimeout", []),
                case("6m", "FrOtelCollectiveNearTimeout", [{"exp_labels": {**pg_labels, "severity": "critical"},
                                                            "exp_annotations": {
                    "summary": "A collective in group 0 of training job llama-7b is close to its timeout",
                    "description": "The oldest in-flight collective of process group 0 (default_pg) in training job "
                                   "llama-7b has used 60% of its timeout (threshold 50%). The watchdog will abort "
                                   "the job when it reaches 100%.",
                    "runbook_url": url + "frotelcollectiveneartimeout"}}]),
                # polls stop at 150 s: time() - 150 > 30 from 3m15s, for 2m: firing from 5m15s.
                case("5m", "FrOtelAgentStale", []),
                case("5m30s", "FrOtelAgentStale", [{"exp_labels": {"severity": "warning", "job": "fr-otel",
                                                                   "training_job": "llama-7b",
                                                                   "instance": "node-a:9741", "rank": "1"},
                                                    "exp_annotations": {
                    "summary": "fr-otel agent on rank 1 of training job llama-7b stopped polling the recorder",
                    "description": "The fr-otel agent of rank 1 (node-a:9741) of training job llama-7b answers "
                                   "scrapes but last polled the Flight Recorder 3m 0s ago (threshold 30s): its "
                                   "metrics are frozen.",
                    "runbook_url": url + "frotelagentstale"}}]),
                # half of node-x down from 1m, for 1m: firing from 2m (the shipped 100 %: never).
                case("1m45s", "FrOtelNodeLost", []),
                case("2m30s", "FrOtelNodeLost", [{"exp_labels": {"severity": "critical", "job": "fr-otel",
                                                                 "training_job": "llama-7b", "host": "node-x"},
                                                  "exp_annotations": {
                    "summary": "Host node-x of training job llama-7b is lost: rank 11 stopped answering",
                    "description": "Prometheus cannot scrape the fr-otel agents of rank 11 at node-x:9751 on host "
                                   "node-x, silent for 1m 45s, while other hosts of training job llama-7b still "
                                   "answer: the host is down, cut off from the network or frozen, or every rank on it "
                                   "died. The job's other ranks will wait for them in their next collective until its "
                                   "timeout. A host is lost when at least 50% of its ranks stop answering while "
                                   "another host of the job answers, or when they stopped over 2 scrape intervals "
                                   "(15s) plus 2s before the job's last host and over one before its median host.",
                    "runbook_url": url + "frotelnodelost"}}]),
            ],
        }],
    }


def test_promtool_lowered_thresholds_change_when_alerts_fire_and_what_they_say(tmp_path: Path) -> None:
    """Lower each threshold in its one place (the threshold:* rule), as the rules header invites:
    the alerts fire earlier and their annotations print the new values."""
    write_lowered_rules(tmp_path, LOWERED)
    (tmp_path / "lowered.test.yml").write_text(yaml.safe_dump(_lowered_rules_test(), sort_keys=False), encoding="utf-8")
    result = run([need("promtool"), "test", "rules", "lowered.test.yml"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # And the shipped thresholds do not fire at those times (the test above depends on lowering).
    (tmp_path / "fr-otel-rules.yml").write_text(RULES_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    result = run([need("promtool"), "test", "rules", "lowered.test.yml"], cwd=tmp_path)
    assert result.returncode != 0
    for alert in ("FrOtelCollectiveStalled", "FrOtelRankLagging", "FrOtelSendRecvStalled", "FrOtelCollectiveNearTimeout",
                  "FrOtelAgentStale", "FrOtelNodeLost"):
        assert f"alertname: {alert}" in result.stdout + result.stderr, alert


def test_every_alert_is_unit_tested_firing_pending_and_resolved() -> None:
    def seconds(duration: str) -> int:
        return sum(int(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in re.findall(r"(\d+)([smh])", duration))

    tests = load_yaml(RULES_TEST_FILE)["tests"]
    cases: dict[str, list[tuple[int, bool]]] = {}
    for test in tests:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], []).append((seconds(case["eval_time"]), bool(case["exp_alerts"])))
    for rule in alert_rules():
        name = rule["alert"]
        got = sorted(cases.get(name, []))
        firing = [t for t, fires in got if fires]
        assert firing, f"{name}: no test case where it fires"
        assert any(t < firing[0] and not fires for t, fires in got), f"{name}: no case before it fires"
        assert any(t > firing[-1] and not fires for t, fires in got), f"{name}: no case where it resolves"
        fired = [c for test in tests for c in test.get("alert_rule_test", [])
                 if c["alertname"] == name and c["exp_alerts"]]
        for case in fired:
            for alert in case["exp_alerts"]:
                assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}, name


def test_rule_metric_names_known() -> None:
    known = set(CONTRACT_METRICS) | recorded_names() | allow_listed_metrics() | {"up"}
    for where, expr in rule_exprs():
        unknown = metric_names(expr) - known
        assert not unknown, f"{where}: unknown metrics {unknown}"


def test_dcgm_rules_join_old_and_new_names() -> None:
    """Each DCGM quantity is read under its pre-4.9 `or` its 4.9 name, and gets a host label."""
    rules = {rule.get("record"): rule["expr"] for rule in load_rules()}
    pairs = {
        "host_gpu:dcgm_gpu_utilization:ratio": ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO"),
        "host_gpu:dcgm_gpu_temperature:celsius": ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS"),
        "host_gpu:dcgm_power_usage:watts": ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS"),
        "host_gpu:dcgm_xid_error:last": ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"),
        "host_gpu:dcgm_fb_used:bytes": ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES"),
        "host_gpu:dcgm_sm_clock:hertz": ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_SM_CLOCK_HERTZ"),
        "host_gpu:dcgm_nvlink_throughput:bytes_per_second": ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                                                             "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND"),
    }
    for record, (old, new) in pairs.items():
        expr = rules[record]
        assert {old, new} <= metric_names(expr), record
        assert " or " in expr and '"host"' in expr and "Hostname" in expr and "hostname" in expr, record


# ----------------------------------------------------------------------------------------------
# dashboards
# ----------------------------------------------------------------------------------------------
DASHBOARDS = load_dashboards()


def test_dashboards_are_the_three_expected() -> None:
    assert sorted(DASHBOARDS) == ["fr-otel-infra.json", "fr-otel-overview.json", "fr-otel-rank.json"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_identity_and_layout(name: str) -> None:
    dash = DASHBOARDS[name]
    assert dash["id"] is None
    assert dash["uid"] == Path(name).stem, "stable uid = file name"
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dash["uid"])
    assert dash["title"].startswith("fr-otel / ")
    assert "fr-otel" in dash["tags"]
    assert isinstance(dash["schemaVersion"], int) and 36 <= dash["schemaVersion"] <= 41
    panels = list(iter_panels(dash["panels"]))
    for p in panels:  # core panel types of Grafana 10-12 only: no plugin to install
        assert p["type"] in {"row", "stat", "timeseries", "table", "heatmap", "traces"}, p["type"]
        assert p["type"] == "row" or (p.get("title") and p.get("description") is not None and "options" in p), p
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids), "panel ids unique"
    occupied: dict[tuple[int, int], int] = {}
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in occupied, f"{p['title']!r} overlaps panel {occupied[(x, y)]}"
                occupied[(x, y)] = p["id"]


def test_dashboard_uids_unique() -> None:
    uids = [d["uid"] for d in DASHBOARDS.values()]
    assert len(uids) == len(set(uids))


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_datasource_variables(name: str) -> None:
    variables = {v["name"]: v for v in DASHBOARDS[name]["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["tempo"]["type"] == "datasource" and variables["tempo"]["query"] == "tempo"
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, var["name"]
            if var.get("includeAll"):
                assert var.get("allValue") == ".*", f"{var['name']}: All must match a missing label too"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_every_panel_and_target_on_a_datasource_variable(name: str) -> None:
    prometheus = {"type": "prometheus", "uid": "${datasource}"}
    tempo = {"type": "tempo", "uid": "${tempo}"}
    for panel in iter_panels(DASHBOARDS[name]["panels"]):
        if panel["type"] == "row":
            continue
        assert panel.get("datasource") in (prometheus, tempo), f"{panel['title']!r}: {panel.get('datasource')}"
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            assert t.get("datasource") == panel["datasource"], f"{panel['title']!r} target {t.get('refId')}"
            assert ("expr" in t) == (panel["datasource"] == prometheus), panel["title"]
    for ann in DASHBOARDS[name]["annotations"]["list"]:
        assert ann["datasource"] == prometheus, ann["name"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_units_on_every_panel(name: str) -> None:
    for panel in iter_panels(DASHBOARDS[name]["panels"]):
        if panel["type"] != "row":
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
            assert unit, f"{panel['title']!r} has no unit"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_rate_interval(name: str) -> None:
    """Every rate()/irate()/increase() range is $__rate_interval; the one exception is a stat panel
    totalling a counter over the dashboard range, increase(...[$__range])."""
    dash = DASHBOARDS[name]
    stat_exprs = {t["expr"] for p in iter_panels(dash["panels"]) if p["type"] == "stat" for t in p["targets"]}
    checked = 0
    for where, expr in dashboard_exprs(dash):
        for m in re.finditer(r"\b(rate|irate|increase)\s*\(", expr):
            depth, i = 1, m.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(expr[i], 0)
                i += 1
            ranges = re.findall(r"\[([^\]]*)\]", expr[m.end():i])
            assert ranges, f"{where}: {m.group(1)}() without a range"
            for r in ranges:
                ok = r == "$__rate_interval" or (m.group(1) == "increase" and r == "$__range" and expr in stat_exprs)
                assert ok, f"{where}: {m.group(1)}(...[{r}]) should use $__rate_interval"
            checked += 1
    assert checked, "each dashboard has rate/increase panels"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_metric_names_known(name: str) -> None:
    known = set(CONTRACT_METRICS) | recorded_names() | allow_listed_metrics()
    for where, expr in dashboard_exprs(DASHBOARDS[name]):
        unknown = metric_names(expr) - known
        assert not unknown, f"{where}: {unknown} is neither the agent's contract, a recording rule nor allow-listed"


def test_every_contract_metric_and_allow_listed_name_is_used() -> None:
    used = set()
    for dash in DASHBOARDS.values():
        for _, expr in dashboard_exprs(dash):
            used |= metric_names(expr)
    for _, expr in rule_exprs():
        used |= metric_names(expr)
    assert not set(CONTRACT_METRICS) - used, "contract metrics nobody shows"
    stale = allow_listed_metrics() - used - {"DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL"}
    assert not stale, f"allow-listed but unused: {stale}"
    assert "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL" in used


def test_dashboard_expressions_substitute_cleanly() -> None:
    for dash in DASHBOARDS.values():
        values = variable_values(dash, {"rank": "0"})
        for where, expr in dashboard_exprs(dash):
            assert "$" not in substitute(expr, values).replace('"$1"', ""), where


def _links(dash: dict) -> list[dict]:
    out = []
    for panel in iter_panels(dash["panels"]):
        out += panel.get("links", [])
        for ov in panel.get("fieldConfig", {}).get("overrides", []):
            for prop in ov["properties"]:
                if prop["id"] == "links":
                    out += prop["value"]
    return out


def test_trace_links_use_the_attribute_contract() -> None:
    contract = {v for k, v in vars(attributes).items() if k.isupper() and isinstance(v, str)}
    traceql_queries = []
    for dash in DASHBOARDS.values():
        for link in _links(dash):
            url = link["url"]
            if url.startswith("/explore"):
                state = json.loads(unquote(url.split("left=", 1)[1]))
                assert state["datasource"] == "${tempo}"
                (query,) = state["queries"]
                assert query["datasource"] == {"type": "tempo", "uid": "${tempo}"} and query["queryType"] == "traceql"
                traceql_queries.append(query["query"])
            elif url.startswith("/d/"):
                uid = url.split("/")[2]
                assert uid in {d["uid"] for d in DASHBOARDS.values()}, url
            else:
                pytest.fail(f"unexpected link {url}")
        for panel in iter_panels(dash["panels"]):
            if panel.get("datasource", {}).get("type") == "tempo":
                traceql_queries += [t["query"] for t in panel["targets"] if t["query"].startswith("{")]
    assert len(traceql_queries) >= 4
    for query in traceql_queries:
        assert query.count("{") == query.count("}"), query
        for attr in re.findall(r"\bspan\.([\w.]+)", query):
            assert attr in contract, f"{attr} is not in src/fr_otel/trace/attributes.py ({query})"
    assert any(attributes.IS_CULPRIT in q and attributes.RANK in q for q in traceql_queries)


def test_incident_counts_take_the_max_over_a_jobs_ranks() -> None:
    """Every rank of an incident counts it in its own fr_incidents_total: a query that totals
    incidents across ranks takes the max per job (or reads one rank), never the sum."""
    checked = 0
    for name, dash in DASHBOARDS.items():
        for where, expr in dashboard_exprs(dash):
            if "fr_incidents_total" not in expr:
                continue
            checked += 1
            per_job = re.search(r"max by \(job, training_job(, rank)?\) \(increase\(fr_incidents_total", expr)
            one_rank = 'rank="$rank"' in expr
            assert per_job or one_rank, f"{name} {where}: {expr}"
            summed = re.search(r"sum(\s+by\s*\([^)]*\))?\s*\(increase\(fr_incidents_total", expr)
            assert one_rank or not summed, f"{name} {where}: a sum over ranks"
    assert checked >= 6


def test_panels_that_judge_against_an_alert_threshold_read_its_rule() -> None:
    """"Groups stalled" counts against the stall threshold series the stall alerts build on (the job's own, else
    the rule's: one source), and no dashboard variable restates a rule threshold."""
    (stalled,) = [p for p in iter_panels(DASHBOARDS["fr-otel-overview.json"]["panels"])
                  if p["title"] == "Groups stalled"]
    (target,) = stalled["targets"]
    assert "> pg:fr_stall_threshold:seconds" in target["expr"], target["expr"]
    (alert,) = [r for r in alert_rules() if r["alert"] == "FrOtelCollectiveStalled"]
    assert target["expr"].split("{")[0].split("(")[-1] in alert["expr"], "the alert's series"
    rules = {r["record"]: r["expr"] for r in load_rules() if "record" in r}
    assert "pg:fr_stall_alert_after:seconds" in alert["expr"]
    assert "pg:fr_stall_threshold:seconds" in rules["pg:fr_stall_alert_after:seconds"], "the alert's threshold"
    assert "threshold:fr_collective_stalled:seconds" in rules["pg:fr_stall_threshold:seconds"]
    for name, dash in DASHBOARDS.items():
        for var in dash.get("templating", {}).get("list", []):
            assert "threshold" not in (var.get("label") or var["name"]).lower(), f"{name}: ${var['name']}"


def test_overview_shows_the_stall_at_a_glance_and_links_each_late_rank_to_its_trace() -> None:
    """The overview's stat row, age heatmap, "who is behind" table with rank/group links, incident
    annotations and exemplars: what on-call reads first."""
    dash = DASHBOARDS["fr-otel-overview.json"]
    panels = {p["title"]: p for p in iter_panels(dash["panels"])}
    stats = [p["title"] for p in panels.values() if p["type"] == "stat"]
    for title in ("Oldest in-flight collective", "Ranks behind", "Groups stalled", "Incidents in range"):
        assert title in stats
    assert panels["In-flight collective age by rank"]["type"] == "heatmap"
    who = panels["Who is behind"]
    assert who["type"] == "table"
    link_fields = {ov["matcher"]["options"] for ov in who["fieldConfig"]["overrides"]
                   if any(p["id"] == "links" for p in ov["properties"])}
    assert {"rank", "pg_name"} <= link_fields
    annotations = {a["name"]: a for a in dash["annotations"]["list"]}
    assert "fr_incidents_total" in annotations["fr-otel incidents"]["expr"]
    assert any(t.get("exemplar") for p in panels.values() for t in p.get("targets", []))


def test_rank_and_infra_dashboards() -> None:
    rank = DASHBOARDS["fr-otel-rank.json"]
    variables = {v["name"]: v for v in rank["templating"]["list"]}
    assert variables["rank"]["type"] == "query" and not variables["rank"]["multi"]
    assert any(p["type"] == "traces" for p in iter_panels(rank["panels"]))
    assert any(t.get("exemplar") for p in iter_panels(rank["panels"]) for t in p.get("targets", []))
    for panel in iter_panels(rank["panels"]):
        for t in panel.get("targets", []):
            if "expr" in t:
                assert 'rank="$rank"' in t["expr"], f"{panel['title']!r}: every query is about the selected rank"
    infra = DASHBOARDS["fr-otel-infra.json"]
    exprs = " ".join(e for _, e in dashboard_exprs(infra))
    assert "group_left(host" in exprs and "host_gpu:dcgm_xid_error:last" in exprs and "node_uname_info" in exprs
    assert "node_infiniband_port_errors_received_total" in exprs and "node_network_receive_errs_total" in exprs


# ----------------------------------------------------------------------------------------------
# collectors (compose, tiers, Slurm, the generated Kubernetes ones)
# ----------------------------------------------------------------------------------------------
def _drop_nulls(node: Any) -> Any:
    """Helm values: a null removes the chart's default at merge time."""
    if isinstance(node, dict):
        return {k: _drop_nulls(v) for k, v in node.items() if v is not None}
    return node


def check_collector_config(config: dict, *, container: bool) -> None:
    """Every pipeline's receivers/processors/exporters and every service extension is defined;
    nothing defined is left unused; in a container, receivers listen on 0.0.0.0. (A component
    written `batch:` is defined with its default config.)"""
    service = config["service"]
    used: dict[str, set[str]] = {"receivers": set(), "processors": set(), "exporters": set()}
    assert service["pipelines"], "no pipeline"
    for name, pipeline in service["pipelines"].items():
        assert pipeline.get("receivers") and pipeline.get("exporters"), name
        for kind, names in used.items():
            for component in pipeline.get(kind, []):
                assert component in config.get(kind, {}), f"pipeline {name}: {kind[:-1]} {component} is not defined"
                names.add(component)
    for kind, names in used.items():
        assert set(config.get(kind, {})) == names, f"{kind} defined but unused: {set(config.get(kind, {})) - names}"
    for ext in service.get("extensions", []):
        assert ext in config.get("extensions", {}), f"extension {ext} is not defined"
    referenced = set(service.get("extensions", []))
    for kind in ("exporters", "receivers"):
        for comp in config.get(kind, {}).values():
            storage = (comp or {}).get("sending_queue", {}).get("storage")
            if storage:
                referenced.add(storage)
    assert set(config.get("extensions", {})) <= referenced, "extensions defined but unused"
    if container:
        for receiver in config["receivers"].values():
            for proto in (receiver or {}).get("protocols", {}).values():
                endpoint = (proto or {}).get("endpoint", "")
                assert endpoint.startswith("0.0.0.0:"), f"receiver endpoint {endpoint!r}: must be 0.0.0.0 in a container"


COLLECTOR_CONFIGS = {
    "compose/otel-collector.yaml": True,
    "compose/jaeger.yaml": True,
    "collector/agent.yaml": True,
    "collector/tier2.yaml": True,
    "slurm/otel-collector-node.yaml": False,
}


@pytest.mark.parametrize("rel", sorted(COLLECTOR_CONFIGS))
def test_collector_pipelines_are_wired(rel: str) -> None:
    check_collector_config(load_yaml(DEPLOY / rel), container=COLLECTOR_CONFIGS[rel])


def test_compose_collector_exports_to_tempo_and_jaeger() -> None:
    config = load_yaml(COMPOSE_DIR / "otel-collector.yaml")
    endpoints = {e["endpoint"] for e in config["exporters"].values() if "endpoint" in e}
    assert {"tempo:4317", "jaeger:4317"} <= endpoints
    grpc = config["receivers"]["otlp"]["protocols"]
    assert grpc["grpc"]["endpoint"] == "0.0.0.0:4317" and grpc["http"]["endpoint"] == "0.0.0.0:4318"
    tempo = load_yaml(COMPOSE_DIR / "tempo.yaml")
    assert tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] == "0.0.0.0:4317"


def test_tier1_load_balances_by_trace_id_and_tier2_keeps_incidents() -> None:
    agent = load_yaml(DEPLOY / "collector" / "agent.yaml")
    assert agent["exporters"]["loadbalancing"]["routing_key"] == "traceID"
    tier2 = load_yaml(DEPLOY / "collector" / "tier2.yaml")
    policies = {p["type"]: p for p in tier2["processors"]["tail_sampling"]["policies"]}
    attr = policies["string_attribute"]["string_attribute"]
    assert attr["key"] == attributes.SPAN_ROLE and attr["values"] == ["incident"]
    assert policies["status_code"]["status_code"]["status_codes"] == ["ERROR"]
    assert attributes.VERDICT in policies["ottl_condition"]["ottl_condition"]["span"][0]
    assert tier2["service"]["pipelines"]["traces"]["processors"].index("tail_sampling") < \
        tier2["service"]["pipelines"]["traces"]["processors"].index("batch")


# ----------------------------------------------------------------------------------------------
# compose and Grafana provisioning
# ----------------------------------------------------------------------------------------------
def test_compose_stack() -> None:
    compose = load_yaml(COMPOSE_DIR / "docker-compose.yml")
    services = compose["services"]
    assert {"otel-collector", "tempo", "jaeger", "prometheus", "alertmanager", "grafana"} <= set(services)
    for name, svc in services.items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and re.search(r"\d", tag), f"{name}: pin the image ({image})"
        for volume in svc.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).exists(), f"{name}: {source} does not exist"
    assert services["otel-collector"]["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert services["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")
    assert {"4317:4317", "4318:4318"} <= set(services["otel-collector"]["ports"])
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    assert "host.docker.internal:host-gateway" in services["prometheus"]["extra_hosts"]
    mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"])
    provider = load_yaml(COMPOSE_DIR / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml")
    assert provider["apiVersion"] == 1
    (prov,) = provider["providers"]
    assert prov["type"] == "file" and prov["options"]["path"] == mounts["../../dashboards"]


def test_grafana_datasources_provisioning() -> None:
    path = COMPOSE_DIR / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
    text = path.read_text(encoding="utf-8")
    # Grafana expands ${VAR} in provisioning files: Grafana's own ${__...} must be written $${__...}.
    assert not re.search(r"(?<!\$)\$\{__", text), "escape Grafana variables as $${...} in provisioning"
    config = load_yaml(path)
    assert config["apiVersion"] == 1
    by_uid = {ds["uid"]: ds for ds in config["datasources"]}
    assert by_uid["prometheus"]["type"] == "prometheus" and by_uid["tempo"]["type"] == "tempo"
    assert by_uid["jaeger"]["type"] == "jaeger"
    destinations = by_uid["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert all(d["name"] == "trace_id" for d in destinations)
    assert any(d.get("datasourceUid") == "tempo" for d in destinations)
    for d in destinations:
        assert d.get("datasourceUid", "tempo") in by_uid


# ----------------------------------------------------------------------------------------------
# Kubernetes
# ----------------------------------------------------------------------------------------------
def _generator():
    spec = importlib.util.spec_from_file_location("fr_otel_k8s_generate", K8S_DIR / "generate.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_kubernetes_generated_is_up_to_date() -> None:
    gen = _generator()
    assert gen.stale() == [], "deploy/kubernetes/generated/ is stale: run python deploy/kubernetes/generate.py"
    result = run([sys.executable, str(K8S_DIR / "generate.py"), "--check"])
    assert result.returncode == 0, result.stderr


def test_kubernetes_yaml_parses() -> None:
    files = sorted(K8S_DIR.rglob("*.yaml"))
    assert len(files) >= 6
    for path in files:
        docs = load_yaml_all(path)
        assert docs, path
        if path.name.endswith(".values.yaml"):
            continue
        for doc in docs:
            assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], path


def test_generated_kubernetes_carries_the_sources_verbatim() -> None:
    gen = _generator()
    generated = K8S_DIR / "generated"
    (rule,) = load_yaml_all(generated / "prometheusrule.yaml")
    assert rule["kind"] == "PrometheusRule" and rule["spec"]["groups"] == load_yaml(RULES_FILE)["groups"]
    configmaps = load_yaml_all(generated / "grafana-dashboards.yaml")
    assert len(configmaps) == len(DASHBOARD_FILES)
    for cm in configmaps:
        assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((fname, text),) = cm["data"].items()
        assert text == (DASHBOARD_DIR / fname).read_text(encoding="utf-8")
    values = load_yaml(generated / "otel-collector-agent.values.yaml")
    assert values["mode"] == "daemonset" and values["ports"]["otlp"]["hostPort"] == 4317
    check_collector_config(_drop_nulls(values["config"]), container=True)
    assert _drop_nulls(values["config"]) == load_yaml(DEPLOY / "collector" / "agent.yaml")
    cm, deployment, service = load_yaml_all(generated / "otel-collector-tier2.yaml")
    assert cm["data"]["config.yaml"] == (DEPLOY / "collector" / "tier2.yaml").read_text(encoding="utf-8")
    assert deployment["kind"] == "Deployment" and service["spec"]["clusterIP"] == "None"
    hostname = values["extraEnvs"][0]["value"]
    assert hostname.startswith(service["metadata"]["name"] + ".")
    (monitor,) = load_yaml_all(generated / "podmonitor.yaml")
    ports = [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]]
    assert ports == [f"fr-otel-{i}" for i in range(gen.MAX_LOCAL_RANKS)]
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert {"action": "replace", "targetLabel": "job", "replacement": "fr-otel"} in endpoint["relabelings"]
    (job,) = load_yaml_all(K8S_DIR / "training-job.example.yaml")
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"]["fr-otel.io/agent"] == "true"
    container = pod["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        f"fr-otel-{i}": gen.METRICS_BASE_PORT + i for i in range(gen.MAX_LOCAL_RANKS)}
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://$(NODE_IP):4317"


def test_kubernetes_example_keeps_the_dumps_on_a_volume_a_watch_sidecar_exports() -> None:
    """The trainer's watchdog dumps land on a pod volume that a native fr-otel watch sidecar mounts at the
    same place, exporting with the trainer's collector, service and job id; it waits for every local rank,
    and its preStop wait (only when dumps exist) outlasts its deadline and fits the pod's grace period."""
    from support.kubernetes import container, pod_spec

    spec = pod_spec(K8S_DIR / "training-job.example.yaml")
    trainer = container(spec, "trainer")
    (watcher,) = [c for c in spec.get("initContainers", []) if c["command"][:2] == ["fr-otel", "watch"]]
    assert watcher["restartPolicy"] == "Always", "a native sidecar: beside the trainer, stopped after it"
    assert trainer["command"][:4] == ["fr-otel", "run", "--", "torchrun"]
    env = {c["name"]: {e["name"]: e for e in c["env"]} for c in (trainer, watcher)}
    for name in ("NODE_IP", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SERVICE_NAME",
                 "FR_OTEL_JOB_ID", "TORCH_FR_DUMP_TEMP_FILE"):
        assert env[trainer["name"]][name] == env[watcher["name"]][name], name
    dumps = env[trainer["name"]]["TORCH_FR_DUMP_TEMP_FILE"]["value"]
    mounts = {c["name"]: {m["mountPath"]: m["name"] for m in c["volumeMounts"]} for c in (trainer, watcher)}
    where = [(path, volume) for path, volume in mounts[trainer["name"]].items() if dumps.startswith(path + "/")]
    assert len(where) == 1, "the dump prefix lies on one of the trainer's volumes"
    path, volume = where[0]
    assert mounts[watcher["name"]].get(path) == volume, "the sidecar mounts that volume at the same path"
    assert {v["name"]: v for v in spec["volumes"]}[volume].get("emptyDir") is not None
    words = watcher["command"]
    nproc = next(w.split("=", 1)[1] for w in trainer["command"] if w.startswith("--nproc-per-node="))
    assert words[words.index("--world-size") + 1] == nproc
    deadline = float(words[words.index("--deadline") + 1])
    (shell,) = [w for w in watcher["lifecycle"]["preStop"]["exec"]["command"] if "sleep" in w]
    assert f"ls {dumps}*" in shell, "waits only when the trainer left dumps"
    wait = float(re.search(r"sleep (\d+)", shell).group(1))
    assert deadline < wait < spec["terminationGracePeriodSeconds"]


# ----------------------------------------------------------------------------------------------
# Slurm
# ----------------------------------------------------------------------------------------------
def test_sbatch_script(tmp_path: Path) -> None:
    script = SLURM_DIR / "fr-otel.sbatch"
    text = script.read_text(encoding="utf-8")
    result = run(["bash", "-n", str(script)])
    assert result.returncode == 0, result.stderr
    assert "scontrol show hostnames" in text and "fr-otel run -- torchrun" in text and "fr-otel watch" in text
    sruns = [line.strip() for line in text.replace("\\\n", " ").splitlines() if line.strip().startswith("srun ")]
    assert len(sruns) == 3, sruns
    collector, watcher, training = sruns
    assert "--ntasks-per-node=1 --overlap" in collector and "otelcol-contrib" in collector
    assert "--overlap" in watcher and "--nodes=1" in watcher and "fr-otel watch" in watcher
    assert "--ntasks-per-node=1" in training and "fr-otel run -- torchrun" in training
    # Run the file_sd writer embedded in the script, as the job would.
    writer = re.search(r"<<'PY'\n(.*?)\nPY\n", text, flags=re.DOTALL).group(1)
    out = tmp_path / "fr-otel-slurm-42.json"
    result = run([sys.executable, "-c", writer, str(out), "4", "9740", "slurm-42", "node-07", "node-08"])
    assert result.returncode == 0, result.stderr
    groups = json.loads(out.read_text())
    check_file_sd(groups)
    assert [g["targets"] for g in groups] == [[f"node-07:{9740 + i}" for i in range(4)],
                                              [f"node-08:{9740 + i}" for i in range(4)]]
    assert all(g["labels"]["training_job"] == "slurm-42" for g in groups)
    assert not list(tmp_path.glob("*.tmp")), "written atomically"
    prometheus = load_yaml(PROM_DIR / "prometheus.yml")
    pattern = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "fr-otel")["file_sd_configs"][0]["files"]
    assert any(Path("targets", out.name).match(p) for p in pattern), "Prometheus picks the file up"


# ----------------------------------------------------------------------------------------------
# docs
# ----------------------------------------------------------------------------------------------
def test_runbook_sections() -> None:
    text = RUNBOOK.read_text(encoding="utf-8")
    sections = {m.group(1): m.group(2) for m in re.finditer(r"^## (\w+)\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)}
    for rule in alert_rules():
        body = sections[rule["alert"]]
        assert "**What it means.**" in body and "**First three things to check.**" in body, rule["alert"]
        assert len(re.findall(r"^\d\. ", body, flags=re.MULTILINE)) >= 3, rule["alert"]
        assert "**Open the trace:**" in body, rule["alert"]
    for anchor in re.findall(r"\]\(#([\w-]+)\)", text):
        assert anchor in github_anchors(text), anchor


def test_architecture_and_deploy_docs() -> None:
    arch = ARCHITECTURE.read_text(encoding="utf-8")
    assert "```" in arch and "+---" in arch, "an ASCII data-flow diagram"
    for term in ("Flight Recorder", "agent", "collector", "Tempo", "Jaeger", "loadbalancing", "routing_key: traceID",
                 "tail sampling"):
        assert term in arch, term
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    assert "no Docker engine" in readme and "statically" in readme
    for rel in ("compose/", "kubernetes/", "slurm/"):
        assert rel in readme


def test_the_deploy_examples_restart_a_job_for_the_retry_exit_code_alone_and_fail_it_for_a_code_fault() -> None:
    """FR_OTEL_ON_HANG=abort's exit codes, as the Kubernetes example's podFailurePolicy and the sbatch script
    test them: a code fault's 70 fails the Job and stops the script; the retry code 75 restarts the pod and makes
    the script resubmit itself; any other code fails the Job."""
    from fr_otel.agent.hang_abort import ABORT_EXIT_CODE, CODE_FAULT_EXIT_CODE

    assert (CODE_FAULT_EXIT_CODE, ABORT_EXIT_CODE) == (70, 75)  # sysexits' EX_SOFTWARE and EX_TEMPFAIL
    job = load_yaml(K8S_DIR / "training-job.example.yaml")
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert [(r["action"], r["onExitCodes"]["operator"], r["onExitCodes"]["values"]) for r in rules] == [
        ("FailJob", "In", [CODE_FAULT_EXIT_CODE]), ("Count", "In", [ABORT_EXIT_CODE]),
        ("FailJob", "NotIn", [0, CODE_FAULT_EXIT_CODE, ABORT_EXIT_CODE])]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] > 0
    trainer = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "trainer")
    assert {"name": "FR_OTEL_ON_HANG", "value": "abort"} in trainer["env"]
    sbatch = (SLURM_DIR / "fr-otel.sbatch").read_text(encoding="utf-8")
    assert f'[ "$rc" -eq {ABORT_EXIT_CODE} ]' in sbatch and 'sbatch ${hosts:+"--exclude=$hosts"}' in sbatch
    fix = sbatch.index(f'if [ "$rc" -eq {CODE_FAULT_EXIT_CODE} ]')
    assert fix < sbatch.index("sbatch ${hosts") and 'exit "$rc"' in sbatch[fix:sbatch.index("sbatch ${hosts")]
