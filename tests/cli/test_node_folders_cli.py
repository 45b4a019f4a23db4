"""``fr-otel analyze``, ``report`` and ``export`` over one incident's node folders: the coordinator's culprits,
no "several incident files" line; folders of different incidents keep that line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "node-folders"
NODES = [str(DATA / "partition" / n) for n in ("node0", "node1", "node2")]
TRACE = "a5f5228dd4713da4f101cf6c5a57d645"


def test_analyze_over_every_node_folder_names_the_cut_off_node_and_no_several_incident_files(run_cli) -> None:
    """The partition's three node folders: node1 (ranks 2-3) cut off, said once, with no problem about incident files."""
    out = run_cli("analyze", *NODES)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "fr-otel: HANG — culprit rank(s) 2-3; node1 cut off"
    assert "several incident files" not in out.stdout + out.stderr
    assert f"trace {TRACE}" in out.stdout


def test_analyze_of_one_node_folder_prints_the_live_verdict_and_where_the_other_dumps_are(run_cli) -> None:
    """node0's folder alone: the coordinator's verdict (node1 lost), never node0 cut off, and where node2's dumps are."""
    out = run_cli("analyze", NODES[0])
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "fr-otel: HANG — culprit rank(s) 2-3; node1 lost"
    assert "node0 cut off" not in out.stdout
    assert "this folder holds rank(s) 0-1 of 6; the live incident also had the dumps of node2 (ranks 4-5)" in out.stdout


def test_analyze_over_two_incidents_folders_still_warns_of_several_incident_files(run_cli) -> None:
    """A node folder of the partition beside one of the code hang: different trace ids, the problem line stays."""
    out = run_cli("analyze", NODES[0], str(DATA / "code_hang" / "node1"))
    assert "several incident files of different incidents among the inputs" in out.stdout


def test_report_and_export_of_one_folder_of_node_subfolders_name_the_cut_off_node(run_cli, tmp_path: Path) -> None:
    """The documented layout (one subfolder per node): the page names node1 cut off; the export reuses the
    live incident's trace id."""
    folder = tmp_path / "incident"
    for node in NODES:
        shutil.copytree(node, folder / Path(node).name)
    page = tmp_path / "incident.html"
    out = run_cli("report", str(folder), "-o", str(page))
    assert out.returncode == 0, out.stderr
    assert "node1</b> cut off" in page.read_text()
    out = run_cli("export", str(folder), "--out", str(tmp_path / "trace"), "-q")
    assert out.returncode == 0, out.stderr
    assert [p.name for p in (tmp_path / "trace").iterdir()] == [f"fr-otel-trace-{TRACE}.jsonl"]


@pytest.mark.parametrize(("incident", "first_line", "host"), [
    ("partition", "fr-otel: HANG — culprit rank(s) 2-3; node1 cut off", ("node1", "cut_off", 12)),
    ("store_host", "fr-otel: HANG — culprit rank(s) 0-1; node0 cut off", ("node0", "cut_off", 12)),
    ("code_hang", "fr-otel: HANG — culprit rank(s) 5", None),
    ("two_nodes_one_host", "fr-otel: HANG — culprit rank(s) 3", None),
])
def test_analyze_of_one_folder_of_node_subfolders_says_the_coordinators_verdict_and_no_several_incident_files(
        run_cli, incident: str, first_line: str, host: tuple[str, str, int] | None) -> None:
    """Each real incident's node folders copied into one folder (a subfolder per node, the documented layout):
    `analyze` names the coordinator's culprits (and the host no other node reached, with its group's step), and
    says nothing of several incident files, in the text and in --json."""
    folder = str(DATA / incident)
    out = run_cli("analyze", folder)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == first_line
    assert "several incident files" not in out.stdout + out.stderr
    doc = json.loads(run_cli("analyze", folder, "--json").stdout)
    assert not [p for p in doc["problems"] if "incident file" in p], doc["problems"]
    if host is not None:
        assert [(h["host"], h["state"], h["group_step"]) for h in doc["hosts"]] == [host]
