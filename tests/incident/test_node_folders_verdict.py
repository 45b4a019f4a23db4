"""One incident, one answer wherever its files are read: each node's folder alone, every node's folder
together (as several paths or copied into one folder with a subfolder per node), and the verdict the
coordinator wrote live (tests/data/node-folders: real lab and torchrun incidents, see its README)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import fr_otel

DATA = Path(__file__).resolve().parents[1] / "data" / "node-folders"
#: Each case: its nodes' folders, and the truth (culprit host, blamed ranks, the step of their collective).
CASES = {
    "partition": ("node1", [2, 3], 12),  # node1 cut off from every other host at step 12
    "store_host": ("node0", [0, 1], 12),  # node0 (the job's store) cut off
    "code_hang": ("node2", [5], 12),  # rank 5 sleeps before its collective
    "freeze": ("node2", [4, 5], 12),  # node2 frozen at step 12 (no dump: the step its peers wait in)
    "two_nodes_one_host": ("vm", [3], 8),  # two torchrun nodes on one host; rank 3 raises
}
#: The node whose incident.json is the coordinator's (store answered) or, the store lost, the first node's own.
COORDINATOR = {"partition": "node0", "store_host": "node1", "code_hang": "node0", "freeze": "node0",
               "two_nodes_one_host": "node0"}


def _nodes(case: str) -> list[Path]:
    return sorted(p for p in (DATA / case).iterdir() if p.is_dir())


def _blamed(culprits: list[dict[str, Any]]) -> tuple[set[str | None], list[int], set[int | None]]:
    """Culprit hosts, blamed ranks and their collectives' steps of a verdict (or of incident.json's summary)."""
    blamed = [c for c in culprits if c["kind"] != "unknown"]
    return {c["host"] for c in blamed}, sorted(c["rank"] for c in blamed), {c["collective_step"] for c in blamed}


def _truth(case: str) -> tuple[set[str | None], list[int], set[int | None]]:
    host, ranks, step = CASES[case]
    return {host}, ranks, {step}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_coordinators_incident_file_names_the_truth(case: str) -> None:
    """The fixture's own check: the verdict the coordinator wrote live names the culprit host, ranks and step."""
    summary = json.loads((DATA / case / COORDINATOR[case] / "incident.json").read_text())["summary"]
    assert _blamed(summary["culprits"]) == _truth(case)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_node_folder_read_together_names_the_coordinators_culprits(case: str) -> None:
    """All nodes' folders as several paths: the live verdict's culprit host, ranks and step, and no problem
    about several incident files."""
    result = fr_otel.analyze_incident(_nodes(case))
    doc = result.to_dict()
    assert _blamed(doc["culprits"]) == _truth(case), doc["culprits"]
    assert not [p for p in doc["problems"] if "several incident files" in p], doc["problems"]
    assert doc["trace_id"] == json.loads((_nodes(case)[0] / "incident.json").read_text())["trace_id"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_folder_with_a_subfolder_per_node_reads_as_every_node_folder(case: str, tmp_path: Path) -> None:
    """The documented layout (incident/node0/, incident/node1/, ...) gives the answer of the node folders
    passed one by one."""
    folder = tmp_path / "incident"
    for node in _nodes(case):
        shutil.copytree(node, folder / node.name)
    together = fr_otel.analyze_incident(_nodes(case)).to_dict()
    one = fr_otel.analyze_incident(folder).to_dict()
    assert _blamed(one["culprits"]) == _truth(case)
    dumps = len([p for node in _nodes(case) for p in node.glob("fr_trace_rank_*")])  # a frozen host left none
    assert one["ranks_loaded"] == together["ranks_loaded"] == dumps


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_node_folder_alone_names_the_culprits_its_incident_file_holds(case: str) -> None:
    """A node's folder alone never contradicts the verdict it holds: the same culprit host, ranks and step
    as its incident.json (the coordinator's copy, or the node's own part when the store was lost)."""
    for node in _nodes(case):
        summary = json.loads((node / "incident.json").read_text())["summary"]
        doc = fr_otel.analyze_incident(node).to_dict()
        assert _blamed(doc["culprits"]) == _blamed(summary["culprits"]), (node, doc["culprits"])
        assert doc["verdict"] == summary["verdict"]


def test_a_node_folder_alone_says_which_ranks_it_holds_and_where_the_others_dumps_are() -> None:
    """node0's folder of the partition (node1 cut off): the coordinator's verdict (node1, ranks 2-3), a note that it
    holds ranks 0-1 of 6 and that node2's dumps (ranks 4-5) are elsewhere, and node0 itself never blamed."""
    doc = fr_otel.analyze_incident(DATA / "partition" / "node0").to_dict()
    assert [c["rank"] for c in doc["culprits"]] == [2, 3]
    assert {h["host"]: h["state"] for h in doc["hosts"]} == {"node1": "lost"}
    note = next(n for n in doc["notes"] if n.startswith("this folder holds"))
    assert "rank(s) 0-1 of 6" in note and "node2 (ranks 4-5)" in note and "incident.json" in note


def test_a_node_folder_alone_shows_every_fact_its_incident_file_holds_of_a_lost_host(tmp_path: Path) -> None:
    """The recorded verdict's host lines keep what the live verdict said of the lost host: the step its group was
    in when it went silent and the address its agent was probed at, besides its last-heard step (seen in the lab:
    node0's folder alone lost the step 12 the live verdict had)."""
    folder = tmp_path / "node0"
    shutil.copytree(DATA / "partition" / "node0", folder)
    doc = json.loads((folder / "incident.json").read_text())
    doc["summary"]["hosts"][0].update(group_step=12, probed="10.213.0.2:9740")
    (folder / "incident.json").write_text(json.dumps(doc))
    host = fr_otel.analyze_incident(folder).to_dict()["hosts"][0]
    assert (host["host"], host["state"], host["last_step"], host["group_step"], host["probed"]) == (
        "node1", "lost", 11, 12, "10.213.0.2:9740")
    assert "in step 12 when it went silent" in host["sentence"]


def test_the_host_no_other_node_reaches_is_cut_off_even_with_its_own_dumps_read() -> None:
    """The store's host partitioned: its own dumps are among the inputs, yet node1 and node2 reached each
    other and not it, so node0 is the one cut off (not an inconclusive collective nobody finished)."""
    doc = fr_otel.analyze_incident(_nodes("store_host")).to_dict()
    assert doc["verdict"] == "hang"
    assert {h["host"]: h["state"] for h in doc["hosts"]}["node0"] == "cut_off"
    assert "none of the other hosts reached node0" in doc["culprits"][0]["evidence"]


def test_a_frozen_hosts_step_is_said_alone_and_together_as_live() -> None:
    """node2 frozen at step 12 sent no dump: the live coordinator placed its group in step 12 from the node
    summaries, whose step maps stay on their nodes. Each surviving node's folder alone, and both together
    (whose steps.json places no collective), name node2 lost, ranks 4-5, in step 12, as the live verdict did."""
    def said(doc: dict[str, Any]) -> list[tuple[str, str, list[int], int | None]]:
        return [(h["host"], h["state"], h["missing"], h["group_step"]) for h in doc["hosts"]]
    live = json.loads((DATA / "freeze" / "node0" / "incident.json").read_text())["summary"]
    assert said(live) == [("node2", "lost", [4, 5], 12)]
    for doc in [fr_otel.analyze_incident(node).to_dict() for node in _nodes("freeze")] + [
            fr_otel.analyze_incident(_nodes("freeze")).to_dict()]:
        assert said(doc) == said(live), doc["hosts"]
        assert "in step 12 when it went silent" in doc["hosts"][0]["sentence"]
