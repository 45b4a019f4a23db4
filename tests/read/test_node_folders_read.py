"""Reading one incident's node folders: their incident files are one identity with every node's network view,
files of different incidents are one problem line, and a folder of node subfolders reads as those folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fr_otel.read.discovery import node_folders
from fr_otel.read.incident_file import find_identity
from fr_otel.read.reader import read_dumps

DATA = Path(__file__).resolve().parents[1] / "data" / "node-folders"


def _copy(tmp_path: Path, *pairs: tuple[str, str]) -> Path:
    """``tmp_path/incident/<node>/`` for each (case, node): one folder with a subfolder per node."""
    for case, node in pairs:
        shutil.copytree(DATA / case / node, tmp_path / "incident" / f"{case}-{node}")
    return tmp_path / "incident"


def test_the_incident_files_of_one_incidents_nodes_are_one_identity_with_every_nodes_view() -> None:
    """node0's copy of the coordinator's file and node1's own part (same trace id): one identity, no problem,
    the views of node2 (the coordinator) and node1 both kept."""
    problems: list[str] = []
    identity = find_identity([DATA / "partition" / n for n in ("node0", "node1", "node2")], problems)
    assert identity is not None and problems == []
    assert sorted(v.seen_from for v in identity.views) == ["node1", "node2"]
    assert len(identity.sources) == 3


def test_incident_files_of_different_incidents_are_one_problem_and_none_is_used() -> None:
    """Two incidents' folders (different trace ids) still say "several incident files", naming both traces."""
    problems: list[str] = []
    assert find_identity([DATA / "partition" / "node0", DATA / "code_hang" / "node1"], problems) is None
    (line,) = problems
    assert "several incident files of different incidents" in line and "a5f5228dd4713da4f101cf6c5a57d645" in line


def test_a_folder_of_node_subfolders_of_one_incident_reads_as_those_folders(tmp_path: Path) -> None:
    """incident/node0, node1, node2 of one trace id: every node's dumps and side files, no "no dump files" line."""
    folder = tmp_path / "incident"
    for node in ("node0", "node1", "node2"):
        shutil.copytree(DATA / "partition" / node, folder / node)
    assert node_folders([folder]) == [str(folder / n) for n in ("node0", "node1", "node2")]
    read = read_dumps(folder)
    assert sorted(read.dumps) == [0, 1, 2, 3, 4, 5]
    assert read.side.identity is not None and len(read.side.views) == 2
    assert not [p for p in read.problems if "no dump files" in p or "several incident" in p], read.problems


def test_a_folder_of_two_incidents_subfolders_is_not_taken_for_node_folders(tmp_path: Path) -> None:
    """Subfolders whose incident files name different traces are two incidents: the folder still says to pass one."""
    folder = _copy(tmp_path, ("partition", "node0"), ("code_hang", "node1"))
    assert node_folders([folder]) == [folder]
    read = read_dumps(folder)
    assert read.dumps == {} and any("pass one of them (one incident each)" in p for p in read.problems)


def test_an_incident_file_listing_another_nodes_dumps_is_not_stale_beside_this_nodes(tmp_path: Path) -> None:
    """An incident file that lists node1's dumps (a node-local writer's), read beside node0's dumps it does not
    list, is still this incident's: only a listed dump of another size says the dumps were overwritten."""
    folder = tmp_path / "node"
    shutil.copytree(DATA / "partition" / "node0", folder)
    raw = json.loads((folder / "incident.json").read_text())
    sizes = {p.name: p.stat().st_size for p in (DATA / "partition" / "node1").glob("fr_trace_rank_*")}
    (folder / "incident.json").write_text(json.dumps({**raw, "files": sizes}))
    read = read_dumps(folder)
    assert read.side.identity is not None, read.problems
    assert not [p for p in read.problems if "changed since" in p]
    raw["files"] = {"fr_trace_rank_0": 1}  # a listed dump of another size: overwritten since
    (folder / "incident.json").write_text(json.dumps(raw))
    read = read_dumps(folder)
    assert read.side.identity is None and any("changed since it was written (fr_trace_rank_0)" in p
                                              for p in read.problems)
