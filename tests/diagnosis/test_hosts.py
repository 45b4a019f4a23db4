"""Which node: a lost host, a node cut off, the store's host lost, told apart from what each side saw."""

from __future__ import annotations

import json
from pathlib import Path

from fr_otel import analyze, build_job, read_dumps
from fr_otel.common.ids import trace_id_for
from fr_otel.report.text import render_verdict
from fr_otel.testing.dump_builder import DumpBuilder

HOSTS = {r: f"node{r // 2}" for r in range(6)}  # 3 hosts x 2 ranks


def _job(folder: Path, present: list[int]) -> int:
    """6 gloo ranks, 12 all_reduces done; #13 entered by the ranks ``present`` keep and never completed;
    the others left no dump. Returns when #13 was enqueued (ns)."""
    job = DumpBuilder(6, backend="gloo")
    for _ in range(12):
        job.collective(job.world)
    job.collective(job.world, ranks=present, done=False)
    stall_ns = job.clock
    job.write(folder)
    for path in folder.iterdir():
        if int(path.name.rsplit("_", 1)[-1].split(".")[0]) not in present:
            path.unlink()
    return stall_ns


def _host_map(folder: Path, heard: dict[int, int] | None = None, store_host: str | None = None) -> None:
    ranks = {str(r): {"host": h, **({"last_heard_ns": heard[r]} if heard and r in heard else {})}
             for r, h in HOSTS.items()}
    doc = {"version": 1, "world_size": 6, "ranks": ranks, **({"store_host": store_host} if store_host else {})}
    (folder / "ranks.json").write_text(json.dumps(doc))


def _network(folder: Path, **network: object) -> None:
    (folder / "incident.json").write_text(json.dumps({
        "format": "fr-otel/incident/1", "job_id": "j", "incident": "1", "trace_id": f"{trace_id_for('j', '1'):032x}",
        "network": network}))


def test_a_partitioned_node_is_named_as_a_lost_host_with_when_it_went_silent(tmp_path: Path) -> None:
    """Ranks 2-3 (node1) left no dump and stopped beating 0.4 s before the others stalled: node1 is lost,
    its ranks are the culprits, the host line says when."""
    stall = _job(tmp_path, [0, 1, 4, 5])
    _host_map(tmp_path, {0: stall + 9 * 10**9, 1: stall + 9 * 10**9, 2: stall - 4 * 10**8, 3: stall - 4 * 10**8,
                         4: stall + 9 * 10**9, 5: stall + 9 * 10**9})
    verdict = analyze(build_job(read_dumps(tmp_path)))
    assert verdict.verdict == "hang"
    assert {(c.rank, c.kind, c.host) for c in verdict.blamed} == {(2, "missing_dump", "node1"), (3, "missing_dump", "node1")}
    (lost,) = [h for h in verdict.hosts if h.state == "lost"]
    assert lost.host == "node1" and lost.missing == (2, 3) and abs(lost.silent_before_s - 0.4) < 1e-6
    text = render_verdict(verdict)
    assert "node1 (ranks 2-3): no dump; last heard" in text and "0.4 s before the others stalled" in text
    assert "node1 lost" in text.splitlines()[0]
    assert verdict.to_dict()["hosts"][0]["state"] == "lost"


def test_a_node_that_reaches_no_other_host_calls_itself_cut_off(tmp_path: Path) -> None:
    """From node1's own local incident: the store and both other hosts are silent: node1 is the one cut off;
    its own ranks are the only culprits, the other hosts' ranks are "unreachable from here", not culprits."""
    _job(tmp_path, [2, 3])
    _host_map(tmp_path, store_host="node0")
    _network(tmp_path, seen_from="node1", store_address="10.0.0.1:29500", store_host="node0",
             store_silent_since_ns=1, answered={"node0": False, "node2": False},
             probed={"node0": "10.0.0.1:9400", "node2": "10.0.0.3:9400"})
    verdict = analyze(build_job(read_dumps(tmp_path)))
    assert verdict.verdict == "hang"
    assert sorted(c.rank for c in verdict.culprits) == [2, 3] == sorted(c.rank for c in verdict.blamed)
    assert [h.host for h in verdict.hosts if h.state == "cut_off"] == ["node1"]
    away = {h.host: h for h in verdict.hosts if h.state == "unreachable"}
    assert sorted(away) == ["node0", "node2"] and away["node2"].missing == (4, 5)
    assert away["node2"].sentence().startswith("node2 (ranks 4-5): unreachable from here")
    assert "its agent at 10.0.0.3:9400 does not answer" in away["node2"].sentence()
    assert any("unreachable from here (node1 is cut off), not culprits" in n for n in verdict.notes)
    assert "node1 cut off" in render_verdict(verdict).splitlines()[0]


def test_a_host_that_could_not_be_probed_never_makes_a_node_think_itself_cut_off(tmp_path: Path) -> None:
    """From node1: node0 (the store's host) did not answer, node2 was not probed (no address, its name does not
    resolve here): node1 is not cut off; node0 is the store's lost host, node2's ranks are not blamed."""
    _job(tmp_path, [2, 3])
    _host_map(tmp_path, store_host="node0")
    _network(tmp_path, seen_from="node1", store_address="10.0.0.1:29500", store_host="node0",
             store_silent_since_ns=1_764_590_000_000_000_000, answered={"node0": False},
             probed={"node0": "10.0.0.1:9400"}, not_probed={"node2": "its name does not resolve here"})
    verdict = analyze(build_job(read_dumps(tmp_path)))
    assert not [h for h in verdict.hosts if h.state == "cut_off"]
    assert {h.host: h.state for h in verdict.hosts}["node0"] == "store_lost"
    assert {c.rank for c in verdict.blamed} == {0, 1}


def test_a_frozen_hosts_line_says_the_step_its_group_was_in_when_it_went_silent(tmp_path: Path) -> None:
    """node2's ranks left no dump and no step at their last heartbeat: the step of the collective their peers wait
    in (step 12, from the peers' step map) is in the host line, its JSON and the culprits' collective step."""
    stall = _job(tmp_path, [0, 1, 2, 3])
    _host_map(tmp_path, {0: stall + 9 * 10**9, 1: stall + 9 * 10**9, 2: stall + 9 * 10**9, 3: stall + 9 * 10**9,
                         4: stall - 4 * 10**8, 5: stall - 4 * 10**8})
    (tmp_path / "steps.json").write_text(json.dumps({"version": 1, "ranks": {
        str(r): {"step": 12, "source": "optimizer", "starts": [[11, 1], [12, stall - 10**3]]} for r in range(4)}}))
    verdict = analyze(build_job(read_dumps(tmp_path)))
    (lost,) = [h for h in verdict.hosts if h.state == "lost"]
    assert (lost.host, lost.last_step, lost.group_step) == ("node2", None, 12)
    assert "node2 (ranks 4-5): no dump; in step 12 when it went silent" in lost.sentence()
    assert lost.to_dict()["group_step"] == 12
    assert {(c.rank, c.collective_step) for c in verdict.blamed} == {(4, 12), (5, 12)}


def test_when_the_stores_host_is_lost_the_survivors_name_it_not_each_other(tmp_path: Path) -> None:
    """From node1: the store (on node0) is silent, node2 still answers: node0's ranks are the suspects,
    node2's are alive elsewhere; the evidence is never 'incomplete, no culprit'."""
    _job(tmp_path, [2, 3])
    _host_map(tmp_path, store_host="node0")
    _network(tmp_path, seen_from="node1", store_address="10.0.0.1:29500", store_host="node0",
             store_silent_since_ns=1_764_590_000_000_000_000, answered={"node0": False, "node2": True})
    verdict = analyze(build_job(read_dumps(tmp_path)))
    assert verdict.verdict == "hang" and verdict.incomplete is None
    assert {(c.rank, c.kind) for c in verdict.blamed} == {(0, "missing_dump"), (1, "missing_dump")}
    assert sorted(c.rank for c in verdict.culprits if not c.blamed) == [4, 5]
    (store,) = [h for h in verdict.hosts if h.state == "store_lost"]
    assert store.host == "node0" and store.store
    assert "has not answered node1 since" in next(c for c in verdict.blamed if c.rank == 0).evidence


def test_the_stores_own_node_cut_off_from_the_rest_names_itself(tmp_path: Path) -> None:
    """node0 holds the store (it answers), but node1 and node2 went silent and answer nothing: node0 is cut off."""
    stall = _job(tmp_path, [0, 1])
    _host_map(tmp_path, {r: stall - 10**8 for r in (2, 3, 4, 5)} | {0: stall + 9 * 10**9, 1: stall + 9 * 10**9},
              store_host="node0")
    _network(tmp_path, seen_from="node0", store_address="10.0.0.1:29500", store_host="node0",
             answered={"node1": False, "node2": False})
    verdict = analyze(build_job(read_dumps(tmp_path)))
    assert [h.host for h in verdict.hosts if h.state == "cut_off"] == ["node0"]
    assert sorted(c.rank for c in verdict.blamed) == [0, 1]


def test_missing_ranks_never_make_a_healthy_verdict(tmp_path: Path) -> None:
    """Nothing in flight (gloo retired it), ranks 2-3 absent and no host map: inconclusive, not healthy."""
    job = DumpBuilder(4, backend="gloo")
    for _ in range(6):
        job.collective(job.world)
    job.write(tmp_path)
    for rank in (2, 3):
        next(tmp_path.glob(f"*_{rank}")).unlink()
    (tmp_path / "ranks.json").write_text(json.dumps({"version": 1, "world_size": 4, "ranks": {}}))
    verdict = analyze(build_job(read_dumps(tmp_path)))
    assert verdict.verdict == "inconclusive"
    assert any("not called healthy" in n for n in verdict.notes)


def test_a_crashed_host_is_named_lost_and_the_stores_host_whose_agents_answer_is_not(tmp_path: Path) -> None:
    """From node2's local incident (the store went away mid-incident, node0's agents still answer from their
    way out): node1 stopped beating first and its agent does not answer: node1 is named lost, with when it
    was last heard; node0, whose agents answer, is no lost host for its store's silence alone (a loaded store
    answers late too); node2's own ranks are not blamed."""
    stall = _job(tmp_path, [4, 5])
    _host_map(tmp_path, {0: stall + 2 * 10**9, 1: stall + 2 * 10**9, 2: stall - 5 * 10**8, 3: stall - 5 * 10**8,
                         4: stall + 2 * 10**9, 5: stall + 2 * 10**9}, store_host="node0")
    _network(tmp_path, seen_from="node2", store_address="10.0.0.1:29500", store_host="node0",
             store_silent_since_ns=stall + 3 * 10**9, answered={"node0": True, "node1": False})
    verdict = analyze(build_job(read_dumps(tmp_path)))
    assert verdict.verdict == "hang"
    states = {h.host: h.state for h in verdict.hosts}
    assert states == {"node0": "unknown", "node1": "lost"}
    (node1,) = [h for h in verdict.hosts if h.host == "node1"]
    assert node1.missing == (2, 3) and node1.last_heard_ns == stall - 5 * 10**8
    assert {c.rank for c in verdict.blamed} >= {2, 3} and not {c.rank for c in verdict.blamed} & {4, 5}
    assert "node1 (ranks 2-3): no dump; last heard" in render_verdict(verdict)

def test_a_lost_hosts_line_says_the_step_its_ranks_were_last_heard_at(tmp_path: Path) -> None:
    """ranks.json keeps each rank's step at its last heartbeat: node1's line says step 12 in the verdict, the trace
    root, incident.json and the page, and the map written beside the incident keeps every rank's step."""
    from fr_otel.incident.pipeline import IncidentPlan, run_incident  # noqa: PLC0415
    from fr_otel.incident.sinks import sink_for  # noqa: PLC0415
    from fr_otel.otlp.config import resolve_export_config  # noqa: PLC0415
    from fr_otel.trace.options import TraceOptions  # noqa: PLC0415

    stall = _job(tmp_path, [0, 1, 4, 5])
    _host_map(tmp_path, {0: stall + 9 * 10**9, 1: stall + 9 * 10**9, 2: stall - 5 * 10**8, 3: stall - 4 * 10**8,
                         4: stall + 9 * 10**9, 5: stall + 9 * 10**9})
    doc = json.loads((tmp_path / "ranks.json").read_text())
    steps = {0: 14, 1: 14, 2: 11, 3: 12, 4: 14, 5: 14}  # rank 3 was heard last, at step 12
    for rank, step in steps.items():
        doc["ranks"][str(rank)]["last_step"] = step
    (tmp_path / "ranks.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    sink = sink_for(resolve_export_config(environ={}), tmp_path / "traces")  # the embedded file: no network
    result = run_incident(read_dumps(tmp_path), IncidentPlan(trace=TraceOptions(job_id="j", incident="1"), sink=sink,
                                                             files_to=out))
    assert result.job.last_step == steps
    (lost,) = [h for h in result.verdict.hosts if h.state == "lost"]
    assert lost.last_step == 12
    line = "node1 (ranks 2-3): no dump; last heard "
    assert " at step 12, 0.4 s before the others stalled" in lost.sentence() and lost.sentence().startswith(line)
    assert lost.sentence() in render_verdict(result.verdict)
    assert result.trace is not None
    assert list(dict(result.trace.spans[0].attributes or {})["fr_otel.host_findings"]) == [lost.sentence()]
    incident = json.loads((out / "incident.json").read_text())
    (entry,) = [h for h in incident["summary"]["hosts"] if h["host"] == "node1"]
    assert entry["last_step"] == 12 and entry["sentence"] == lost.sentence()
    assert "at step 12, 0.4 s before" in (out / "incident.html").read_text()
    again = json.loads((out / "ranks.json").read_text())
    assert {int(r): e["last_step"] for r, e in again["ranks"].items()} == steps


def _node_folders(tmp_path: Path, views: dict[str, dict[str, bool]]) -> list[Path]:
    """Every rank in #13, none completed; each host's folder holds its two dumps, the host map and its own
    incident file (one incident) with ``views[host]``: which other hosts its agent reached."""
    whole = tmp_path / "all"
    _job(whole, list(range(6)))
    folders = []
    for host, answered in views.items():
        folder = tmp_path / host
        folder.mkdir()
        for path in whole.iterdir():
            if HOSTS[int(path.name.rsplit("_", 1)[-1].split(".")[0])] == host:
                path.rename(folder / path.name)
        _host_map(folder)
        _network(folder, seen_from=host, answered=answered)
        folders.append(folder)
    return folders


def test_the_host_no_other_node_reaches_while_they_reach_each_other_is_cut_off(tmp_path: Path) -> None:
    """Every node's folder read together: node0 and node2 reach each other, nobody reaches node1 and node1 reaches
    nobody: node1 (ranks 2-3) is the one cut off, though every rank's dump is there and all sit in #13."""
    folders = _node_folders(tmp_path, {"node0": {"node1": False, "node2": True},
                                       "node1": {"node0": False, "node2": False},
                                       "node2": {"node0": True, "node1": False}})
    verdict = analyze(build_job(read_dumps(folders)))
    assert verdict.verdict == "hang"
    assert {(c.rank, c.host) for c in verdict.blamed} == {(2, "node1"), (3, "node1")}
    assert [(h.host, h.state) for h in verdict.hosts] == [("node1", "cut_off")]


def test_a_host_others_cannot_reach_but_that_reaches_them_is_not_called_cut_off(tmp_path: Path) -> None:
    """node1's own view says it reached node0: one-way probes prove no partition, so nobody is called cut off;
    and nodes that reached no one at all witness nothing either."""
    folders = _node_folders(tmp_path, {"node0": {"node1": False, "node2": True},
                                       "node1": {"node0": True, "node2": False},
                                       "node2": {"node0": True, "node1": False}})
    assert not [h for h in analyze(build_job(read_dumps(folders))).hosts if h.state == "cut_off"]
    folders = _node_folders(tmp_path / "none", {"node0": {"node1": False, "node2": False},
                                                "node1": {"node0": False, "node2": False},
                                                "node2": {"node0": False, "node1": False}})
    assert not [h for h in analyze(build_job(read_dumps(folders))).hosts if h.state == "cut_off"]


def test_a_store_that_only_answers_slowly_is_no_lost_host_and_leaves_no_host_out(tmp_path: Path) -> None:
    """From node1's local incident under load: its store calls timed out (the store "silent" since then), but
    node0's agents accept a connection at their address and its ranks beat as late as everyone's: node0 is not
    called lost, so nothing names it to leave out; the ranks it cannot see are reported, not blamed on a host."""
    from fr_otel.diagnosis.hosts import LOST_STATES
    from fr_otel.diagnosis.restart import hosts_to_exclude, verdict_action

    stall = _job(tmp_path, [2, 3])
    _host_map(tmp_path, {r: stall + 2 * 10**9 for r in range(6)}, store_host="node0")
    _network(tmp_path, seen_from="node1", store_address="10.0.0.1:29500", store_host="node0",
             store_silent_since_ns=stall + 3 * 10**9, answered={"node0": True, "node2": True},
             probed={"node0": "10.0.0.1:9400", "node2": "10.0.0.3:9400"})
    verdict = analyze(build_job(read_dumps(tmp_path)))
    assert not [h for h in verdict.hosts if h.state in LOST_STATES], [h.sentence() for h in verdict.hosts]
    assert hosts_to_exclude(verdict) == () and verdict_action(verdict) != "restart_elsewhere"
    assert "node0" not in render_verdict(verdict).splitlines()[0]
