"""Which verdicts call for ending a job early, what to do then, and which hosts a restart leaves out: only a
stuck job whose verdict says where, never a straggler, a healthy or inconclusive job, nor a job that was ending;
a host only on evidence against it, never for a fault in the job's own code."""

from __future__ import annotations

import shlex
from functools import cache
from pathlib import Path

import pytest

from fr_otel import analyze_incident
from fr_otel.common.commands import exclude_command_lines
from fr_otel.diagnosis.restart import (EXIT_CODES, Action, calls_for_restart, exclude_reason, hosts_to_exclude,
                                      verdict_action)
from fr_otel.diagnosis.verdict import Verdict
from support.megatron import catalog

DATA = Path(__file__).resolve().parents[1] / "data"


@cache
def simulated(name: str, *args: object) -> Verdict:
    return getattr(catalog, name)(*args).verdict()


@pytest.mark.parametrize("name,args", [
    ("healthy_snapshot", (0.1,)), ("healthy_snapshot", (0.4,)), ("healthy_snapshot", (0.7,)),
    ("straggler", ()), ("quiescent", ()), ("slow_host", ()),
])
def test_a_healthy_or_straggling_job_never_calls_for_a_restart(name: str, args: tuple) -> None:
    v = simulated(name, *args)
    assert v.verdict in ("healthy", "straggler", "inconclusive"), v.verdict
    assert not calls_for_restart(v) and hosts_to_exclude(v) == ()


@pytest.mark.parametrize("name", ["gpu_stall", "cpu_stop", "never_posts_recv", "dead_node", "two_faults"])
def test_a_hang_that_names_its_culprits_calls_for_a_restart(name: str) -> None:
    v = simulated(name)
    assert v.verdict == "hang" and v.blamed
    assert calls_for_restart(v)


@pytest.mark.parametrize("fault", ["gpu_error_1st", "gpu_error_2nd", "lock_gil_1st", "lock_gil_2nd"])
def test_the_nvrx_hangs_call_for_a_restart_but_name_no_host_their_dumps_do_not_carry(fault: str) -> None:
    v = analyze_incident(DATA / "nvrx-fr-traces" / fault).verdict
    assert calls_for_restart(v) and hosts_to_exclude(v) == ()


@pytest.mark.parametrize("name,action", [
    ("gpu_stall", Action.RESTART_ELSEWHERE),  # stuck inside the collective: a device fault, the host's
    ("cpu_stop", Action.RESTART_IN_PLACE),  # never reached it, and nothing beyond the dumps says why
    ("mismatch", Action.FIX_CODE),  # another collective than its peers': the code diverged
])
def test_the_action_follows_the_culprits_failure_domain(name: str, action: Action) -> None:
    """A device stall restarts elsewhere, a code divergence is the code to fix (exit 70), a rank that never
    reached its collective with no evidence why restarts in place (exit 75)."""
    v = simulated(name)
    assert verdict_action(v) == action, [(c.rank, c.kind, c.cause) for c in v.blamed]
    assert EXIT_CODES[action] == (70 if action == Action.FIX_CODE else 75)
    if action != Action.RESTART_ELSEWHERE:
        assert hosts_to_exclude(v) == ()


@pytest.mark.parametrize("case,hosts,action", [
    ("freeze/node0", ("node2",), Action.RESTART_ELSEWHERE), ("freeze/node1", ("node2",), Action.RESTART_ELSEWHERE),
    ("partition/node0", ("node1",), Action.RESTART_ELSEWHERE), ("partition/node2", ("node1",), Action.RESTART_ELSEWHERE),
    ("store_host/node1", ("node0",), Action.RESTART_ELSEWHERE), ("code_hang", (), Action.FIX_CODE),
    ("code_hang/node1", (), Action.RESTART_IN_PLACE),  # its live verdict recorded no cause: no evidence either way
])
def test_the_lab_folders_exclude_exactly_the_lost_host_and_never_a_code_hangs(
        case: str, hosts: tuple[str, ...], action: Action) -> None:
    """Read as each surviving node's folder holds it: a lost, cut-off or store host is left out, once; a rank
    hung in its own code (node2's rank 5 asleep, read from every node's folder) leaves its healthy host in: the
    code is to fix; one node's folder whose live verdict recorded no cause says so, and leaves it in too."""
    result = analyze_incident(DATA / "node-folders" / case)
    assert hosts_to_exclude(result.verdict) == hosts and verdict_action(result.verdict) == action
    doc = result.to_dict()
    assert doc["exclude_hosts"] == list(hosts) and doc["action"] == action
    domains = {(c["cause"] or {"domain": "unknown"})["domain"] for c in doc["culprits"] if c["kind"] != "unknown"}
    assert domains == {{Action.FIX_CODE: "software", Action.RESTART_ELSEWHERE: "infrastructure",
                        Action.RESTART_IN_PLACE: "unknown"}[action]}, doc["culprits"]


def test_an_incident_raised_as_the_job_ended_excludes_nothing() -> None:
    """Two nodes on one host, an uncaught exception: a hang word, but the job was ending anyway."""
    v = analyze_incident(DATA / "node-folders" / "two_nodes_one_host" / "node0").verdict
    assert v.verdict == "hang" and v.job_ended
    assert not calls_for_restart(v) and hosts_to_exclude(v) == ()


def test_the_commands_name_only_host_names_and_quote_the_reason() -> None:
    """Host names come from files others can write: one that is no host name (a command substitution, a leading
    ``-`` a command would take for an option, a comma that would split the list) is left out, never quoted in."""
    v = analyze_incident(DATA / "node-folders" / "freeze" / "node0").verdict
    assert exclude_reason(v) == "fr-otel hang: node2 lost, culprit rank(s) 4-5"
    lines = exclude_command_lines(("node2", "n3 $(touch /tmp/x)", "-lkubernetes.io/os=linux", "a,b", "gpu-7.dc"),
                                  "why; rm -rf /")
    assert [shlex.split(c) for _, c in lines] == [
        ["sbatch", "--exclude=node2,gpu-7.dc", "JOB_SCRIPT"],
        ["scontrol", "update", "NodeName=node2,gpu-7.dc", "State=DRAIN", "Reason=why; rm -rf /"],
        ["kubectl", "cordon", "node2"], ["kubectl", "cordon", "gpu-7.dc"]]
    assert [who for who, _ in lines] == ["Slurm", "Slurm", "Kubernetes", "Kubernetes"]
    assert exclude_command_lines((), "x") == () == exclude_command_lines(("-x",), "x")


def test_a_host_goes_by_the_schedulers_node_name_where_the_job_knew_it(tmp_path: Path) -> None:
    """Slurm's --exclude and scontrol take Slurm's node names: a rank that ran under SLURMD_NODENAME says it."""
    import json
    import shutil

    folder = tmp_path / "freeze"
    shutil.copytree(DATA / "node-folders" / "freeze" / "node0", folder)
    ranks = json.loads((folder / "ranks.json").read_text())
    for r, entry in ranks["ranks"].items():
        entry["node"] = f"gpu-{entry['host']}"
    (folder / "ranks.json").write_text(json.dumps(ranks))
    v = analyze_incident(folder).verdict
    assert [c.rank for c in v.blamed] == [4, 5] and hosts_to_exclude(v) == ("gpu-node2",)
