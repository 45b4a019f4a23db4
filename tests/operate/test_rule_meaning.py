"""The rules and dashboards mean what the product means: one "stalled", one "behind", one group identity.

Read from deploy/prometheus/fr-otel-rules.yml and dashboards/*.json as written (no promtool, no
Prometheus): the numbers and labels the rest of fr-otel uses come from fr_otel.common.stall and
fr_otel.common.promql, and these tests hold the rules' copies of them equal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from support.rules import RULES_FILE, groupings

from fr_otel.common.promql import BLAME_FLOOR_S, GROUP_DESCRIPTION, GROUP_LABELS
from fr_otel.common.stall import DEFAULT_STALL_S

DASHBOARD_FILES = sorted((Path(__file__).resolve().parents[2] / "dashboards").glob("*.json"))
STALLED = "threshold:fr_collective_stalled:seconds"
BEHIND = "threshold:fr_blame_floor:seconds"
#: Labels a grouping of a process group may add to its identity on purpose: its description, and
#: the finer rows some rules and panels keep (per rank, per peer, per host, per op).
ON_PURPOSE = {GROUP_DESCRIPTION, "rank", "instance", "peer", "host", "op"}


def _rules() -> list[dict[str, Any]]:
    with RULES_FILE.open(encoding="utf-8") as f:
        return [rule for group in yaml.safe_load(f)["groups"] for rule in group["rules"]]


def _threshold(name: str) -> float:
    (expr,) = [rule["expr"] for rule in _rules() if rule.get("record") == name]
    m = re.fullmatch(r"vector\(([\d.]+)\)", expr.strip())
    assert m, f"{name}: {expr}"
    return float(m.group(1))


def _dashboard_exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _dashboard_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _dashboard_exprs(item)


def test_the_rules_stall_threshold_is_the_products_stall() -> None:
    """threshold:fr_collective_stalled:seconds is DEFAULT_STALL_S: the agent's incident, the
    offline verdict, the culprit query and the alerts call the same wait stalled."""
    assert _threshold(STALLED) == DEFAULT_STALL_S


def test_the_blame_floor_is_behind_not_stalled() -> None:
    """threshold:fr_blame_floor:seconds is BLAME_FLOOR_S, below the stall: a rank is named behind
    before its group counts as stalled, and the floor's rule reads only as 'behind'."""
    assert _threshold(BEHIND) == BLAME_FLOOR_S < DEFAULT_STALL_S
    (blame,) = [rule for rule in _rules() if rule.get("record") == "rank_pg:fr_behind:lag"]
    assert BEHIND in blame["expr"] and STALLED not in blame["expr"]
    header = RULES_FILE.read_text(encoding="utf-8").split("groups:", 1)[0]
    (floor_line,) = [line for line in header.splitlines() if BEHIND in line]
    assert "behind" in floor_line and "stall" not in floor_line.split(BEHIND)[0], floor_line


def test_every_alert_on_an_op_in_flight_compares_it_with_the_one_stall_threshold() -> None:
    """An alert that judges how long a collective or send/recv has been in flight compares against
    threshold:fr_collective_stalled:seconds (through the recorded rules it reads: the job's own threshold where its
    agents export one, else that) and no other seconds threshold (no second 'stalled')."""
    records = {rule["record"]: rule["expr"] for rule in _rules() if "record" in rule}

    def thresholds(expr: str, seen: set[str]) -> set[str]:
        found = set(re.findall(r"threshold:\w+:seconds", expr))
        for name in set(re.findall(r"[a-z_]+:[\w]+:[\w]+", expr)) & set(records) - seen - found:
            seen.add(name)
            found |= thresholds(records[name], seen)
        return found

    # The blame floor says who is behind (FrOtelRankLagging's rank_pg:fr_behind:lag), not when an op is stalled.
    judged = {rule["alert"]: thresholds(rule["expr"], set()) - {"threshold:fr_blame_floor:seconds"}
              for rule in _rules() if "alert" in rule and re.search(r"(inflight|p2p)[\w:]*age_seconds", rule["expr"])}
    assert judged == {name: {STALLED} for name in ("FrOtelCollectiveStalled", "FrOtelRankLagging",
                                                   "FrOtelSendRecvStalled")}


def test_every_grouping_of_a_process_group_holds_its_identity() -> None:
    """Every by (...) / on(...) over pg_name, in the rules and the dashboards, holds GROUP_LABELS
    (job, training_job, pg_name), plus only labels added on purpose (pg_desc, rank, peer, ...)."""
    exprs = [(rule.get("record") or rule["alert"], rule["expr"]) for rule in _rules()]
    for path in DASHBOARD_FILES:
        exprs += [(path.name, e) for e in _dashboard_exprs(json.loads(path.read_text(encoding="utf-8")))]
    checked, wrong = 0, []
    for where, expr in exprs:
        for clause in groupings(expr):
            labels = set(clause)
            if "pg_name" not in labels:
                continue
            checked += 1
            if not set(GROUP_LABELS) <= labels or labels - set(GROUP_LABELS) - ON_PURPOSE:
                wrong.append(f"{where}: ({', '.join(clause)})")
    assert checked > 30
    assert not wrong, "groupings of a process group without its identity:\n" + "\n".join(wrong)
