"""Multi-node truth on a real 3-host lab (network + UTS namespaces, 2 gloo ranks per host, fr-otel run):
each fault class names the right host, ranks and step, never holds the job alive, and never calls the wreck
healthy. The hosts' names do not resolve between them (as between Kubernetes pods), the harder case: the
agents probe each other at the addresses they published; the frozen host's case runs a second time with names
that resolve (the lab's other mode, where a probe by name would answer too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support.lab import lab_unavailable
from support.lab_faults import FAULTS, CaseResult, control_exit_bound, run_case

pytestmark = [pytest.mark.gloo, pytest.mark.lab,
              pytest.mark.skipif(lab_unavailable() is not None, reason=lab_unavailable() or "")]

GLOO_TIMEOUT = 20.0
STALL_SECONDS = 10.0
EXIT_BUDGET = 10.0  # FR_OTEL_FLUSH_TIMEOUT: the agent's whole way out, after the first exit hook
FAULT_STEP = 12
AGENT = {"FR_OTEL_FLUSH_TIMEOUT": f"{EXIT_BUDGET:g}", "FR_OTEL_GATHER_SECONDS": "10"}


#: The fault step's data loading lasts this long and the fault lands 1 s before its end: the collective left in
#: flight is surely step 12's, and every node has beaten in step 12 before the fault (a node beats every 2 s; with
#: 0.05 s steps its last beat may come from any of the first 12 steps, or before the first was counted).
PAUSE_S = 3.5


def _run(fault: str, tmp_path: Path, *, resolve_names: bool = False) -> CaseResult:
    bound = control_exit_bound(fault, GLOO_TIMEOUT) + EXIT_BUDGET
    r = run_case(FAULTS[fault], agent=True, tmp=tmp_path, gloo_timeout=GLOO_TIMEOUT, step=FAULT_STEP,
                 stall_seconds=STALL_SECONDS, cap_s=bound + 15, agent_env=AGENT, pause_s=PAUSE_S,
                 resolve_names=resolve_names)
    for host, lines in sorted(r.agent_lines_by_host.items()):  # shown with -s: the live verdict each node printed
        print(*(f"[{fault}] {host}: {line}" for line in lines if "culprits:" in line), sep="\n")
    return r


def _on(r: CaseResult, node: int) -> list[dict[str, Any]]:
    """The incidents written in host ``node``'s own folder (its own, or the coordinator's copy)."""
    return [i for i in r.incidents if Path(str(i["file"])).parts[0] == f"node{node}"]


def _names_lost(i: dict[str, Any], host: str, ranks: tuple[int, ...], states: tuple[str, ...],
                step: int | None = FAULT_STEP) -> bool:
    """The incident names ``host`` lost (one of ``states``), its ranks ``ranks`` missing, in step ``step``."""
    return any(h.get("host") == host and h.get("state") in states and h.get("missing") == list(ranks)
               and (step is None or (h.get("group_step") == step and f"in step {step} " in h.get("sentence", "")))
               for h in i.get("hosts", []))


def _own_incident_is_cut_off(r: CaseResult, node: int) -> None:
    """The cut-off host's own incident names itself cut off, only its own ranks as culprits, the others'
    hosts "unreachable from here"."""
    own = [i for i in _on(r, node) if any(h.get("state") == "cut_off" for h in i["hosts"])]
    assert own, f"node{node} wrote no incident of its own calling itself cut off: {_story(r)}"
    mine = {2 * node, 2 * node + 1}
    for i in own:
        assert [h["host"] for h in i["hosts"] if h["state"] == "cut_off"] == [f"node{node}"], _story(r)
        assert {c["rank"] for c in i["culprits"]} == mine, f"culprits beyond node{node}'s own ranks: {_story(r)}"
        away = sorted(h["host"] for h in i["hosts"] if h["state"] == "unreachable")
        assert away == sorted(f"node{k}" for k in range(3) if k != node), _story(r)


def _offline_blames(tmp: Path, r: CaseResult, ranks: tuple[int, ...], nodes: tuple[int, ...]) -> None:
    """Read offline after the job, as a user would: each of ``nodes``' incident folders alone, and every node's
    folders of one incident (one trace id) together, blame exactly ``ranks`` (ranks only "unknown" aside), name
    their host lost or cut off in step 12, and the folders together raise no "several incident files" problem."""
    import fr_otel

    by_trace: dict[str, list[Path]] = {}
    for i in r.incidents:
        folder = (tmp / str(i["file"])).parent
        by_trace.setdefault(json.loads((folder / "incident.json").read_text())["trace_id"], []).append(folder)

    host = f"node{ranks[0] // 2}"

    def blamed(doc: dict[str, Any]) -> set[int]:
        return {c["rank"] for c in doc["culprits"] if c["kind"] != "unknown"}

    def named(doc: dict[str, Any]) -> bool:
        return any(h["host"] == host and h["state"] in ("lost", "store_lost", "cut_off")
                   and h.get("group_step") == FAULT_STEP for h in doc["hosts"])

    for k in nodes:
        for i in _on(r, k):
            doc = fr_otel.analyze_incident((tmp / str(i["file"])).parent).to_dict()
            assert blamed(doc) == set(ranks), f"node{k}'s folder alone: {doc['culprits']}\n{_story(r)}"
            assert named(doc), f"node{k}'s folder alone: {doc['hosts']}\n{_story(r)}"
    for trace, folders in by_trace.items():
        doc = fr_otel.analyze_incident(folders).to_dict()
        assert blamed(doc) == set(ranks), f"{trace} over {folders}: {doc['culprits']}\n{_story(r)}"
        assert named(doc), f"{trace} over {folders}: {doc['hosts']}\n{_story(r)}"
        assert not [p for p in doc["problems"] if "several incident files" in p], doc["problems"]


def _story(r: CaseResult) -> str:
    """What a failed assertion prints: each host's agent lines (the newest 40) and each incident without its page
    (the page alone would fill the message and hide the lines that explain the failure)."""
    lines = [f"[{host}] {line[:400]}" for host, host_lines in r.agent_lines_by_host.items() for line in host_lines[-40:]]
    incidents = [str({k: v for k, v in i.items() if k != "html"})[:1500] for i in r.incidents]
    return "\n".join(["agent lines:", *lines, "incidents:", *incidents, f"exits (s after the fault): {r.worker_exit_s}"])


def _exits_in_time(r: CaseResult) -> None:
    """Every rank not at fault exits no later than the job without fr-otel, plus the agent's exit budget."""
    bound = control_exit_bound(r.fault, GLOO_TIMEOUT) + EXIT_BUDGET
    late = {rank: t for rank, t in r.worker_exit_s.items()
            if rank not in FAULTS[r.fault].ranks and (t is None or t > bound)}
    assert not late, f"still alive or late past {bound:.0f} s: {late}\n{_story(r)}"


def _naming(r: CaseResult, host: str, state: str) -> list[dict[str, Any]]:
    """The incidents whose verdict names ``host`` as ``state`` (lost, store_lost, cut_off)."""
    return [i for i in r.incidents if any(h.get("host") == host and h.get("state") == state
                                          for h in i.get("hosts", []))]


def _leaves_out_exactly(r: CaseResult, host: str, tmp: Path) -> None:
    """Every incident whose verdict calls for ending the job restarts elsewhere leaving out ``host`` alone, in its
    summary and trace root, its culprits' causes are infrastructure, and every exclude-hosts.txt a node wrote
    names it alone: the evidence is against that host (an incident raised as the job ended calls for nothing)."""
    acted = [i for i in r.incidents if i.get("action") is not None]
    assert acted, _story(r)
    for i in r.incidents:
        if i.get("action") is None:
            assert not i.get("exclude_hosts"), _story(r)
            continue
        assert i["action"] == "restart_elsewhere" and i["exclude_hosts"] == [host], _story(r)
        if i["has_trace"]:
            assert i["root"].get("fr_otel.action") == "restart_elsewhere", _story(r)
            assert i["root"].get("fr_otel.exclude_hosts") == [host], _story(r)
        assert {c["domain"] for c in i["culprits"] if c["kind"] != "unknown"} == {"infrastructure"}, _story(r)
    lists = [(tmp / p).read_text() for p in r.files if p.endswith("exclude-hosts.txt")]
    assert lists and all(text == f"{host}\n" for text in lists), (lists, _story(r))


def _never_healthy(r: CaseResult) -> None:
    verdicts = [i.get("verdict") for i in r.incidents]
    assert "healthy" not in verdicts, _story(r)
    assert {i.get("incident") for i in r.incidents} <= {"1"}, f"one event, one incident number: {_story(r)}"


@pytest.mark.parametrize(("fault", "resolve_names"), [
    *(pytest.param(fault, False, id=fault) for fault in ("partition", "freeze", "crash")),
    pytest.param("freeze", True, id="freeze-names-resolve")])
def test_a_lost_node_is_named_as_a_host_in_log_json_trace_and_page_and_survivors_exit_in_time(
        fault: str, resolve_names: bool, tmp_path: Path) -> None:
    """node1 cut off, node2 frozen, node1's workers killed: within 30 s of the fault some node's verdict names
    the host as lost (its ranks, when it was last heard, the step its group was in), in the log line, incident.json,
    the trace root and incident.html, and so does every incident in each survivor's folder (cut off, frozen); the
    cut-off node's own incident blames only its own ranks, and read offline each survivor's folder, alone or with the
    others of its incident, blames only the lost node's ranks, in step 12 (cut off, frozen); the survivors exit within
    the no-agent control plus the exit budget; nothing says healthy."""
    truth = FAULTS[fault]
    host = f"node{truth.node}"
    r = _run(fault, tmp_path, resolve_names=resolve_names)
    named = _naming(r, host, "lost")
    assert named, _story(r)
    others = [k for k in range(3) if k != truth.node]
    for k in others if fault != "crash" else ():  # each survivor's folder: the host, its ranks, step 12
        assert _on(r, k) and all(_names_lost(i, host, truth.ranks, ("lost",)) for i in _on(r, k)), _story(r)
    assert any(_names_lost(i, host, truth.ranks, ("lost",), FAULT_STEP if fault != "crash" else None)
               for i in named), _story(r)
    if fault == "partition":
        _own_incident_is_cut_off(r, truth.node)
    if fault in ("partition", "freeze"):
        _leaves_out_exactly(r, host, tmp_path)
    if fault != "crash":  # each survivor's folder alone, and all of them together (not a crash's, as above)
        _offline_blames(tmp_path, r, truth.ranks, tuple(others))
    first = min(named, key=lambda i: i["written_s"])
    assert first["written_s"] <= 30, _story(r)
    finding = next(h for h in first["hosts"] if h["host"] == host)
    assert finding["ranks"] == list(truth.ranks) and finding["missing"] == list(truth.ranks)
    assert finding["last_heard_ns"], _story(r)
    if fault != "crash":  # said with the step its ranks were last heard at: every node beat in step 12
        assert finding["last_step"] == FAULT_STEP and f"at step {FAULT_STEP}," in finding["sentence"], _story(r)
    assert {c["rank"] for c in first["culprits"] if c["kind"] == "missing_dump"} == set(truth.ranks)
    assert first["root"].get("fr_otel.lost_hosts") == [host] and first["has_trace"]
    assert f"{host}</b> lost" in first["html"]
    if fault != "crash":  # the page says the step too, in every incident that names the host
        assert all(f"in step {FAULT_STEP} when it went silent" in i["html"] for i in named), _story(r)
    said = f"{host} (ranks {truth.ranks[0]}-{truth.ranks[1]}): no dump" + ("" if fault == "crash" else
                                                                         f"; in step {FAULT_STEP} ")
    assert any(said in line for line in r.agent_lines), _story(r)
    _never_healthy(r)
    _exits_in_time(r)


def test_when_the_stores_host_is_lost_every_side_names_it_and_nobody_is_held(tmp_path: Path) -> None:
    """node0 (the store's host) partitioned: node1's and node2's own incidents name node0 as the suspect, ranks
    0-1, step 12 (the store stopped answering, the other survivor still answers at its published address), none
    calls itself cut off; node0's names itself cut off with only ranks 0-1 as culprits; read offline, node1's and node2's folders, alone or together, blame only ranks 0-1; nobody calls the healthy
    ranks culprits, every node writes its verdict, and every rank exits within control + budget."""
    r = _run("store_host", tmp_path)
    assert _naming(r, "node0", "store_lost"), _story(r)
    for k in (1, 2):
        assert _on(r, k) and all(_names_lost(i, "node0", (0, 1), ("store_lost",)) for i in _on(r, k)), _story(r)
        assert not any(h["state"] == "cut_off" for i in _on(r, k) for h in i["hosts"]), _story(r)
    _own_incident_is_cut_off(r, 0)
    _leaves_out_exactly(r, "node0", tmp_path)
    _offline_blames(tmp_path, r, (0, 1), (1, 2))
    for i in r.incidents:
        blamed = {c["rank"] for c in i["culprits"] if c["kind"] != "unknown"}
        assert blamed <= {0, 1}, f"healthy ranks blamed: {_story(r)}"
    assert {Path(i["file"]).parts[0] for i in r.incidents} == {"node0", "node1", "node2"}, _story(r)
    _never_healthy(r)
    _exits_in_time(r)


def test_a_rank_hung_in_its_own_code_is_named_with_its_host_step_and_first_stop(tmp_path: Path) -> None:
    """Rank 5 (node2) sleeps before its collective at step 12: it alone is the culprit, on node2, at step 12,
    stopped first; the job exits within control + budget."""
    r = _run("code_hang", tmp_path)
    found = [i for i in r.incidents if i["root"].get("fr_otel.culprit_ranks")]
    assert found, _story(r)
    root = found[0]["root"]
    assert root["fr_otel.culprit_ranks"] == ["5"] and root["fr_otel.culprit_hosts"] == ["node2"], _story(r)
    assert str(root.get("fr_otel.first_stopped_rank")) == "5"
    assert any("rank 5 (not_enqueued, host node2, step 12)" in line for line in r.agent_lines), _story(r)
    # Its own code, on a healthy host: the code is to fix, no host is left out, no drain is advised anywhere.
    for i in found:
        assert i["action"] == "fix_code" and i["exclude_hosts"] == [] and "fr_otel.exclude_hosts" not in i["root"]
        assert [c["domain"] for c in i["culprits"] if c["rank"] == 5] == ["software"], _story(r)
        assert "DRAIN" not in i["html"] and "cordon" not in i["html"] and "--exclude" not in i["html"]
    assert not [p for p in r.files if p.endswith("exclude-hosts.txt")], _story(r)
    assert not [line for line in r.agent_lines if "leave out" in line or "DRAIN" in line], _story(r)
    _never_healthy(r)
    _exits_in_time(r)


#: With FR_OTEL_ON_HANG=abort the gloo timeout no longer decides when the survivors leave: make it long.
ABORT_GLOO_TIMEOUT = 300.0


def test_with_abort_a_frozen_hosts_survivors_exit_soon_after_the_verdict_and_leave_it_out(tmp_path: Path) -> None:
    """FR_OTEL_ON_HANG=abort and a 300 s gloo timeout; node2 frozen in step 12: every survivor rank, stuck in the
    collective, ends with exit code 75 within the stall threshold + 30 s of the fault (without abort it would wait
    for the gloo timeout), each survivor's torchrun exits too, and each survivor's folder has exclude-hosts.txt
    naming node2 alone, as the trace root's fr_otel.exclude_hosts does."""
    truth = FAULTS["freeze"]
    bound = STALL_SECONDS + 30
    r = run_case(truth, agent=True, tmp=tmp_path, gloo_timeout=ABORT_GLOO_TIMEOUT, step=FAULT_STEP,
                 stall_seconds=STALL_SECONDS, cap_s=bound + 30, agent_env={**AGENT, "FR_OTEL_ON_HANG": "abort"},
                 pause_s=PAUSE_S, resolve_names=False)
    survivors = {rank: t for rank, t in r.worker_exit_s.items() if rank not in truth.ranks}
    assert sorted(survivors) == [0, 1, 2, 3] and all(t is not None and t <= bound for t in survivors.values()), \
        f"survivors' exits (s after the fault): {survivors}\n{_story(r)}"
    ended = [line for line in r.agent_lines if "ends its process with exit code 75" in line]
    # A rank that read the verdict from the store names the host; one that read it from its leader's board knows
    # only that the verdict calls for a restart (its node's incident.json says the rest).
    named = [line.split("leave out next time: ", 1)[1] for line in ended if "leave out next time: " in line]
    assert ended and named and all(n.startswith("node2 (") for n in named), _story(r)
    for host in ("node0", "node1"):
        code, at = r.torchrun_exit[host]
        assert code not in (None, 0) and at is not None and at <= bound + EXIT_BUDGET, (host, code, at, _story(r))
    lists = {Path(p).parts[0]: (tmp_path / p).read_text() for p in r.files if p.endswith("exclude-hosts.txt")}
    assert lists == {"node0": "node2\n", "node1": "node2\n"}, (lists, _story(r))
    assert all(i["root"].get("fr_otel.exclude_hosts") == ["node2"] for i in r.incidents if i["has_trace"]), _story(r)
    print(f"[freeze, abort] survivors exited {min(survivors.values()):.1f}-{max(survivors.values()):.1f} s after the "
          f"fault (stall threshold {STALL_SECONDS:g} s, gloo timeout {ABORT_GLOO_TIMEOUT:g} s)")
