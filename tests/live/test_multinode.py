"""Multi-node truth on a real 3-host lab (network + UTS namespaces, 2 gloo ranks per host, fr-otel run):
each fault class names the right host, never holds the job alive, and never calls the wreck healthy."""

from __future__ import annotations

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


#: Steps of 1 s in the partition case: a node's heartbeat goes every 2 s, so with the default 0.05 s steps the
#: last one before the cut may come from any of the first 12 steps (or before the first was counted).
SLOW_STEPS = {"partition": {"TRAIN_LOOP_STEP_SLEEP": "1.0"}}


def _run(fault: str, tmp_path: Path) -> CaseResult:
    bound = control_exit_bound(fault, GLOO_TIMEOUT) + EXIT_BUDGET
    return run_case(FAULTS[fault], agent=True, tmp=tmp_path, gloo_timeout=GLOO_TIMEOUT, step=FAULT_STEP,
                    stall_seconds=STALL_SECONDS, cap_s=bound + 15, agent_env={**AGENT, **SLOW_STEPS.get(fault, {})})


def _story(r: CaseResult) -> str:
    return "\n".join([*r.agent_lines[-30:], *(str(i) for i in r.incidents)])[-6000:]


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


def _never_healthy(r: CaseResult) -> None:
    verdicts = [i.get("verdict") for i in r.incidents]
    assert "healthy" not in verdicts, _story(r)
    assert {i.get("incident") for i in r.incidents} <= {"1"}, f"one event, one incident number: {_story(r)}"


@pytest.mark.parametrize("fault", ["partition", "freeze", "crash"])
def test_a_lost_node_is_named_as_a_host_in_log_json_trace_and_page_and_survivors_exit_in_time(
        fault: str, tmp_path: Path) -> None:
    """node1 cut off, node2 frozen, node1's workers killed: within 30 s of the fault some node's verdict names
    the host as lost (its ranks, when it was last heard, cut off: at which step), in the log line, incident.json, the trace root and
    incident.html; the survivors exit within the no-agent control plus the exit budget; nothing says healthy."""
    truth = FAULTS[fault]
    host = f"node{truth.node}"
    r = _run(fault, tmp_path)
    named = _naming(r, host, "lost")
    assert named, _story(r)
    first = min(named, key=lambda i: i["written_s"])
    assert first["written_s"] <= 30, _story(r)
    finding = next(h for h in first["hosts"] if h["host"] == host)
    assert finding["ranks"] == list(truth.ranks) and finding["missing"] == list(truth.ranks)
    assert finding["last_heard_ns"], _story(r)
    if fault == "partition":  # said with the step its ranks were last heard at
        step = finding["last_step"]
        assert step is not None and step <= FAULT_STEP and f"at step {step}," in finding["sentence"], _story(r)
    assert {c["rank"] for c in first["culprits"] if c["kind"] == "missing_dump"} == set(truth.ranks)
    assert first["root"].get("fr_otel.lost_hosts") == [host] and first["has_trace"]
    assert f"{host}</b> lost" in first["html"]
    assert any(f"{host} (ranks {truth.ranks[0]}-{truth.ranks[1]}): no dump" in line for line in r.agent_lines)
    _never_healthy(r)
    _exits_in_time(r)


def test_when_the_stores_host_is_lost_every_side_names_it_and_nobody_is_held(tmp_path: Path) -> None:
    """node0 (the store's host) partitioned: the survivors' own incidents name node0 as the suspect (the store
    stopped answering, the other survivor still answers), node0's names itself cut off, nobody calls the
    healthy ranks culprits, every node writes its verdict, and every rank exits within control + budget."""
    r = _run("store_host", tmp_path)
    assert _naming(r, "node0", "store_lost"), _story(r)
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
    _never_healthy(r)
    _exits_in_time(r)
