"""Dashboards as code: the committed JSON is a fresh build, and the builder enforces the conventions.

dashboards/build.py writes dashboards/*.json with grafana-foundation-sdk (the test extra); the
lints and the real-Prometheus evaluation of every query (tests/operate/test_operate_static.py,
tests/operate/test_operate_promql.py) read those files, so they test what the builder writes.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"


@pytest.fixture(scope="module")
def build() -> ModuleType:
    """dashboards/build.py as a module (it puts dashboards/ on sys.path for its fr_dashboards)."""
    if importlib.util.find_spec("grafana_foundation_sdk") is None:
        if sys.version_info < (3, 11):
            pytest.skip("grafana-foundation-sdk needs Python 3.11")
        pytest.fail("grafana-foundation-sdk is not installed: pip install -e '.[test]'")
    spec = importlib.util.spec_from_file_location("fr_otel_dashboards_build", DASHBOARDS / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kit(build: ModuleType) -> ModuleType:
    """The panel helpers (fr_dashboards.kit)."""
    return importlib.import_module("fr_dashboards.kit")


@pytest.fixture(scope="module")
def board(build: ModuleType) -> ModuleType:
    """The dashboard frame (fr_dashboards.board)."""
    return importlib.import_module("fr_dashboards.board")


def test_the_committed_dashboards_are_a_fresh_build(build: ModuleType) -> None:
    """dashboards/*.json are byte for byte what dashboards/build.py writes with the pinned SDK."""
    assert build.sdk_problem() is None
    assert sorted(build.render()) == ["fr-otel-infra.json", "fr-otel-overview.json", "fr-otel-rank.json"]
    assert build.stale() == [], "dashboards/*.json differ from the builder: run python dashboards/build.py"
    done = subprocess.run([sys.executable, str(DASHBOARDS / "build.py"), "--check"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_a_hand_edit_a_missing_file_and_a_stray_file_are_all_reported(build: ModuleType, tmp_path: Path) -> None:
    """A copy with one title edited by hand, one dashboard deleted and one extra JSON: each is named."""
    for path in DASHBOARDS.glob("*.json"):
        shutil.copy2(path, tmp_path / path.name)
    assert build.stale(tmp_path) == []
    edited = tmp_path / "fr-otel-overview.json"
    dash = json.loads(edited.read_text(encoding="utf-8"))
    dash["panels"][1]["title"] = "Oldest collective"
    edited.write_text(json.dumps(dash, indent=2) + "\n", encoding="utf-8")
    (tmp_path / "fr-otel-infra.json").unlink()
    (tmp_path / "mine.json").write_text("{}\n", encoding="utf-8")
    assert build.stale(tmp_path) == ["fr-otel-overview.json", "fr-otel-infra.json", "mine.json"]


def test_a_builder_change_without_a_rebuild_is_reported(build: ModuleType, kit: ModuleType,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A panel added in code but not built into the committed JSON makes the check fail."""
    original = build.rank.build

    def with_one_more_panel() -> object:
        return original().row("New", kit.timeseries("Lost nodes", [("up == 0", "{{instance}}")], unit="none"))

    monkeypatch.setattr(build.rank, "build", with_one_more_panel)
    assert build.stale() == ["fr-otel-rank.json"]


def test_the_sdk_pin_has_one_home_and_another_build_is_named(build: ModuleType, tmp_path: Path) -> None:
    """The version the builder insists on is pyproject's pin; another installed build, or no pin, gets one line."""
    assert build.pinned_sdk() == "1769699379!11.6.0"
    problem = build.sdk_problem(installed="1769699998!10.1.0")
    assert problem is not None and "\n" not in problem
    assert "grafana-foundation-sdk==1769699379!11.6.0" in problem and "found 1769699998!10.1.0" in problem
    unpinned = tmp_path / "pyproject.toml"
    unpinned.write_text('[project.optional-dependencies]\ntest = ["pytest>=8"]\n', encoding="utf-8")
    problem = build.sdk_problem(installed="1769699379!11.6.0", pyproject=unpinned)
    assert problem is not None and "\n" not in problem and "pins no grafana-foundation-sdk" in problem


def test_a_missing_sdk_is_one_line_not_a_traceback() -> None:
    """Without the SDK the script says what to install, in one line, and exits 2 (not 1: nothing is stale)."""
    code = ("import runpy, sys; sys.modules['grafana_foundation_sdk'] = None; sys.argv = ['build.py', '--check']; "
            f"runpy.run_path({str(DASHBOARDS / 'build.py')!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr == "dashboards/build.py: grafana-foundation-sdk is not installed: pip install -e '.[test]'\n"


# ------------------------------------------------------------------------------------------------
# conventions, enforced where panels are built
# ------------------------------------------------------------------------------------------------
def test_a_range_other_than_the_rate_interval_is_refused(kit: ModuleType) -> None:
    """rate()/increase() over a fixed window fails the build; [$__range] only in a stat; a regex in a label string is no range."""
    with pytest.raises(ValueError, match=r"range \[5m\]"):
        kit.timeseries("Polls", [("rate(fr_agent_polls_total[5m])", "{{rank}}")], unit="ops")
    with pytest.raises(ValueError, match=r"range \[\$__range\]"):
        kit.timeseries("Incidents", [("increase(fr_incidents_total[$__range])", "{{rank}}")], unit="none")
    with pytest.raises(ValueError, match=r"range \[1h\]"):
        kit.table("Incidents", ["increase(fr_incidents_total[1h])"], unit="none", columns=kit.Columns(order=["rank"]))
    kit.stat("Incidents in range", "sum(increase(fr_incidents_total[$__range]))", unit="none")
    kit.timeseries("Replays", [('label_replace(rate(x[$__rate_interval]), "host", "$1", "instance", "([^:]+).*")',
                                "{{host}}")], unit="cps")


def test_a_time_series_without_a_legend_is_refused(kit: ModuleType) -> None:
    """Each line of a time series or heatmap is named by its legend: none, or Grafana's __auto, fails the build."""
    for legend in ("", "__auto"):
        with pytest.raises(ValueError, match="needs a legend"):
            kit.timeseries("Up", [("up", "{{instance}}"), ("up == 0", legend)], unit="none")
        with pytest.raises(ValueError, match="needs a legend"):
            kit.heatmap("Age", ("fr_inflight_collective_age_seconds", legend), unit="s", y_label="rank")


def test_a_table_sorted_or_overridden_by_a_column_it_does_not_show_is_refused(kit: ModuleType) -> None:
    """The sort column and each field override name a shown header (the hand-kept overview sorted by one it lacked)."""
    columns = kit.Columns(order=["rank", "Value #A"], rename={"Value #A": "in its step for"})
    with pytest.raises(ValueError, match=r"no column \['enqueued lag'\]"):
        kit.table("Steps", ["fr_training_step_age_seconds"], unit="s", columns=columns, sort="enqueued lag")
    with pytest.raises(ValueError, match=r"no column \['Value #A'\]"):
        kit.table("Steps", ["fr_training_step_age_seconds"], unit="s", columns=columns,
                  fields=[kit.field("Value #A", unit="s")])
    kit.table("Steps", ["fr_training_step_age_seconds"], unit="none", columns=columns, sort="in its step for",
              fields=[kit.field("in its step for", unit="s")])


def test_stat_panels_only_go_in_the_row_on_top(kit: ModuleType, board: ModuleType) -> None:
    """A stat in a later row, or a stat row below another row, fails the build."""
    number = kit.stat("Ranks", "count(fr_info)", unit="none")
    dash = board.Board("t", "fr-otel / T", "", variables=board.job_variables(), annotations=[])
    dash.row("First", kit.timeseries("Up", [("up", "{{instance}}")], unit="none"))
    with pytest.raises(ValueError, match="stat row on top"):
        dash.row("Second", number)
    with pytest.raises(ValueError, match="must be the first row"):
        dash.stat_row("Now", number)


def test_a_panel_added_in_one_call_carries_every_convention(kit: ModuleType, board: ModuleType) -> None:
    """One helper call per panel: datasource variable on panel and targets, a unit, refIds, a legend,
    the house legend table, a numbered place on the grid, and a dashboard with "id": null."""
    dash = board.Board("fr-otel-test", "fr-otel / Test", "A test.", variables=board.job_variables(),
                       annotations=board.job_annotations())
    dash.stat_row("Now", kit.stat("Nodes lost", "count(up == 0) or vector(0)", unit="none", steps=kit.RED_FROM_ONE))
    dash.row("Nodes", kit.timeseries("Lost nodes", [("up == 0", "{{instance}}"), ("up", "all {{instance}}")],
                                     unit="none", description="Scrape targets that stopped answering."))
    out = json.loads(board.render(dash))
    assert out["id"] is None and out["uid"] == "fr-otel-test" and out["schemaVersion"] == board.SCHEMA_VERSION
    assert [(p["id"], p["type"], p["gridPos"]) for p in out["panels"]] == [
        (1, "row", {"h": 1, "w": 24, "x": 0, "y": 0}), (2, "stat", {"h": 4, "w": 4, "x": 0, "y": 1}),
        (3, "row", {"h": 1, "w": 24, "x": 0, "y": 5}), (4, "timeseries", {"h": 8, "w": 12, "x": 0, "y": 6})]
    prometheus = {"type": "prometheus", "uid": "${datasource}"}
    stat, lines = out["panels"][1], out["panels"][3]
    for panel in (stat, lines):
        assert panel["datasource"] == prometheus and panel["fieldConfig"]["defaults"]["unit"] == "none"
        assert all(t["datasource"] == prometheus for t in panel["targets"])
    assert [(t["refId"], t["legendFormat"], t["range"]) for t in lines["targets"]] == [
        ("A", "{{instance}}", True), ("B", "all {{instance}}", True)]
    assert (stat["targets"][0]["instant"], stat["fieldConfig"]["defaults"]["thresholds"]["steps"][1]) == (
        True, {"value": 1, "color": "red"})
    assert lines["options"]["legend"] == {"displayMode": "table", "placement": "right", "showLegend": True,
                                          "calcs": ["max", "lastNotNull"]}
    assert {v["name"] for v in out["templating"]["list"]} == {"datasource", "tempo", "job", "training_job"}


def test_trace_links_keep_grafana_variables_unencoded_for_grafana_to_fill(build: ModuleType) -> None:
    """The Explore link's state is URL-encoded JSON, except ${...}, which Grafana substitutes before opening it."""
    links = importlib.import_module("fr_dashboards.links")
    url = links.incidents_blaming().build().url
    assert url.startswith("/explore?orgId=1&left=%7B%22datasource%22%3A%22${tempo}%22")
    assert "${__data.fields.rank}" in url and "${__from}" in url and "%24%7B" not in url
    assert links.rank_drilldown().build().to_json() == {
        "title": "Rank ${__data.fields.rank} drill-down",
        "url": "/d/fr-otel-rank/fr-otel-rank-drill-down?${datasource:queryparam}&${tempo:queryparam}"
               "&${job:queryparam}&${training_job:queryparam}&var-rank=${__data.fields.rank}&${__url_time_range}"}
