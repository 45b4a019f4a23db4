"""The operations side as data: the dashboards' and rules' PromQL, Grafana variable substitution,
metric names in PromQL, the agent's metric contract, and the deploy folders.

Shared by the static checks (tests/operate/test_operate_static.py) and the tests that run every
expression on a real Prometheus (tests/operate/test_operate_promql.py, test_operate_p2p_promql.py,
tests/live/test_lab_prometheus.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.rules import RULES_FILE

__all__ = ['ARCHITECTURE', 'COMPOSE_DIR', 'CONTRACT_METRICS', 'DASHBOARD_DIR', 'DASHBOARD_FILES', 'DEPLOY', 'GRAFANA_BUILTINS', 'K8S_DIR', 'PROM_DIR', 'REPO', 'RULES_PACE_TEST_FILE', 'RULES_TEST_FILE', 'RUNBOOK', 'RUNBOOK_URL', 'SLURM_DIR', 'alert_rules', 'allow_listed_metrics', 'dashboard_exprs', 'github_anchors', 'iter_panels', 'load_dashboards', 'load_rules', 'load_yaml', 'load_yaml_all', 'metric_names', 'need', 'recorded_names', 'rule_exprs', 'run', 'substitute', 'variable_values']

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "dashboards"
DASHBOARD_FILES = sorted(DASHBOARD_DIR.glob("*.json"))
DEPLOY = REPO / "deploy"
PROM_DIR = DEPLOY / "prometheus"
RULES_TEST_FILE = PROM_DIR / "rules.test.yml"
#: The stall alerts at their group's 5 s pace (promtool applies one evaluation interval per file).
RULES_PACE_TEST_FILE = PROM_DIR / "rules-pace.test.yml"
RUNBOOK = REPO / "docs" / "runbook.md"
ARCHITECTURE = REPO / "docs" / "architecture.md"
COMPOSE_DIR = DEPLOY / "compose"
K8S_DIR = DEPLOY / "kubernetes"
SLURM_DIR = DEPLOY / "slurm"
RUNBOOK_URL = "https://github.com/fr-otel/fr-otel/blob/main/docs/runbook.md#"

# The agent's metric contract (what it exports; Prometheus adds job/instance and `up`).
CONTRACT_METRICS = {
    "fr_inflight_collective_age_seconds": {"rank", "pg_name", "pg_desc", "op"},
    "fr_inflight_collective_timeout_seconds": {"rank", "pg_name", "pg_desc", "op"},
    "fr_inflight_p2p_age_seconds": {"rank", "pg_name", "pg_desc", "op", "peer"},
    "fr_last_enqueued_seq": {"rank", "pg_name", "pg_desc"},
    "fr_last_completed_seq": {"rank", "pg_name", "pg_desc"},
    "fr_stall_threshold_seconds": {"rank"},
    "fr_abort_after_seconds": {"rank"},
    "fr_collective_wait_seconds_total": {"rank", "pg_name", "pg_desc"},
    "fr_collectives_completed_total": {"rank", "pg_name", "pg_desc"},
    "fr_incidents_total": {"rank"},
    "fr_exclude_host": {"rank", "incident", "exclude_host"},  # only once an incident this rank concluded names one
    "fr_info": {"rank", "local_rank", "host", "torch_version", "backend", "world_size", "recorder_capacity"},
    "fr_agent_polls_total": {"rank"},
    "fr_agent_errors_total": {"rank"},
    "fr_agent_export_failures_total": {"rank"},
    "fr_agent_last_poll_timestamp_seconds": {"rank"},
    "fr_recorder_enabled": {"rank"},
    "fr_training_step": {"rank"},
    "fr_training_step_age_seconds": {"rank"},
}

# Values Grafana's built-in variables take when an expression is evaluated outside Grafana.
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h", "__range_s": "3600",
                    "__interval_ms": "15000"}


# ----------------------------------------------------------------------------------------------
# shared helpers
# ----------------------------------------------------------------------------------------------
def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def load_yaml_all(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def load_dashboards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text(encoding="utf-8")) for path in DASHBOARD_FILES}


def iter_panels(panels: list[dict]) -> Iterator[dict]:
    """Every panel, rows' nested panels included."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels", []))


def load_rules() -> list[dict]:
    return [rule for group in load_yaml(RULES_FILE)["groups"] for rule in group["rules"]]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in load_rules() if "record" in rule}


def alert_rules() -> list[dict]:
    return [rule for rule in load_rules() if "alert" in rule]


def dashboard_exprs(dash: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every Prometheus query of a dashboard: panel targets, annotations and
    query variables (the selector of ``label_values(selector, label)``)."""
    out: list[tuple[str, str]] = []
    for panel in iter_panels(dash.get("panels", [])):
        for t in panel.get("targets", []):
            if "expr" in t:
                out.append((f"panel {panel['id']} {panel.get('title')!r} {t.get('refId')}", t["expr"]))
    for ann in dash.get("annotations", {}).get("list", []):
        if "expr" in ann:
            out.append((f"annotation {ann['name']!r}", ann["expr"]))
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"] if isinstance(var["query"], str) else var["query"]["query"]
            m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", query)
            assert m, f"variable {var['name']}: only label_values(selector, label) is used here: {query}"
            out.append((f"variable {var['name']}", m.group(1)))
    return out


def rule_exprs() -> list[tuple[str, str]]:
    return [(rule.get("record") or rule["alert"], rule["expr"]) for rule in load_rules()]


def variable_values(dash: dict, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """What each dashboard variable stands for when a query is run outside Grafana: multi-value or
    All-able variables match everything (``.*``), custom/textbox variables their current value."""
    values = dict(GRAFANA_BUILTINS)
    for var in dash.get("templating", {}).get("list", []):
        name, kind = var["name"], var["type"]
        if kind == "datasource":
            continue
        if kind in ("custom", "textbox", "constant"):
            values[name] = str(var.get("current", {}).get("value", var.get("query", "")))
        elif var.get("includeAll") or var.get("multi"):
            values[name] = var.get("allValue") or ".*"
    values.update(overrides or {})
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana ``$var`` / ``${var}`` / ``${var:fmt}`` / ``[[var]]`` with values; an unknown
    variable is an error."""

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            if name.isdigit():  # label_replace's "$1": Grafana leaves what is not a variable alone
                return m.group(0)
            raise KeyError(f"unknown Grafana variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)(?::[\w]+)?\}|\$(\w+)|\[\[(\w+)\]\]", repl, expr)


_PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                    "unless", "offset", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (a small tokenizer: strings, label matchers, ranges,
    grouping clauses, numbers, functions and keywords are not metric names)."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', " ", expr)
    s = re.sub(r"'(?:\\.|[^'\\])*'", " ", s)
    s = re.sub(r"\{[^{}]*\}", " ", s)
    s = re.sub(r"\[[^\[\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", s)
    s = re.sub(r"\boffset\s+-?\w+", " ", s)
    s = re.sub(r"\$\{?\w+(?::\w+)?\}?", " ", s)
    s = re.sub(r"(?<![\w:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        token = m.group(0)
        if token.lower() in _PROMQL_KEYWORDS or s[m.end():].lstrip().startswith("("):
            continue
        names.add(token)
    return names


def allow_listed_metrics() -> set[str]:
    """The infra allow-list: backticked names in the list items under dashboards/README.md's
    'Infra metrics allow-list' heading."""
    text = (DASHBOARD_DIR / "README.md").read_text(encoding="utf-8")
    section = text.split("## Infra metrics allow-list", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        if line.startswith("- "):
            names.update(re.findall(r"`([A-Za-z_:][A-Za-z0-9_:]*)`", line))
    return names


def github_anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, **kw)


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed (scripts/setup-system.sh installs Debian's prometheus)")
    return path
