"""Real 16-rank NCCL dumps with injected faults: every fault rank named, no healthy rank accused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fr_otel import analyze, build_job, read_dumps

INCIDENTS = ["gpu_error_1st", "gpu_error_2nd", "lock_gil_1st", "lock_gil_2nd"]


def fault_ranks(incident_dir: Path) -> set[int]:
    """The ground truth, read from the incident's own fault_injection.log."""
    text = (incident_dir / "fault_injection.log").read_text()
    match = re.search(r"Fault ranks: \[([\d, ]+)\]", text)
    assert match, text
    return {int(x) for x in match.group(1).split(",")}


@pytest.mark.parametrize("incident", INCIDENTS)
def test_names_exactly_the_fault_ranks(nvrx: Path, incident: str) -> None:
    """The culprits are the injected fault ranks, no more, no fewer."""
    verdict = analyze(build_job(read_dumps(nvrx / incident)))
    assert verdict.verdict == "hang"
    assert {c.rank for c in verdict.culprits} == fault_ranks(nvrx / incident)
    assert verdict.ranks_loaded == 16 and verdict.world_size == 16
    assert verdict.problems == []


def test_all_eight_fault_ranks_across_incidents(nvrx: Path) -> None:
    """8 of 8 across the four incidents (the best open analyzer names 7)."""
    named = 0
    accused_healthy = 0
    for incident in INCIDENTS:
        truth = fault_ranks(nvrx / incident)
        got = {c.rank for c in analyze(build_job(read_dumps(nvrx / incident))).culprits}
        named += len(got & truth)
        accused_healthy += len(got - truth)
    assert (named, accused_healthy) == (8, 0)


def test_kinds_match_the_fault(nvrx: Path) -> None:
    """GPU errors show as not completing; a held GIL shows as not enqueuing."""
    gpu = analyze(build_job(read_dumps(nvrx / "gpu_error_1st")))
    assert {c.kind for c in gpu.culprits} == {"not_completed"}
    gil = analyze(build_job(read_dumps(nvrx / "lock_gil_2nd")))
    assert {c.kind for c in gil.culprits} == {"not_enqueued"}
    rank10 = next(c for c in gil.culprits if c.rank == 10)
    assert rank10.waiting_ranks and 10 not in rank10.waiting_ranks
    assert rank10.collective_seq_id is not None and rank10.group_desc


def test_idle_rank_without_entries_is_paired_with_its_groups(nvrx: Path) -> None:
    """Rank 9 of lock_gil_1st has no entries: its local pg ids are named by creation order."""
    job = build_job(read_dumps(nvrx / "lock_gil_1st"))
    assert job.dumps[9].entries == []
    group = job.groups["37"]  # TENSOR_MODEL_PARALLEL_GROUP {8, 9, 10, 11}
    assert group.ranks == (8, 9, 10, 11)
    assert 9 in group.local_ids
    progress = job.progress(9, "37")
    assert progress is not None and progress.enqueued == progress.completed == 88683
    assert job.progress(8, "37").enqueued == 88688  # type: ignore[union-attr]


def test_pipeline_groups_with_send_recv_are_not_compared(nvrx: Path) -> None:
    """Counters of p2p groups mix p2p and collective seqs: comparing them would blame rank 8."""
    verdict = analyze(build_job(read_dumps(nvrx / "gpu_error_1st")))
    pipeline = next(g for g in verdict.groups if g.group.name == "43")
    assert pipeline.group.has_p2p and pipeline.note
    assert 8 not in {c.rank for c in verdict.culprits}


def test_cli_json_contract(nvrx: Path, run_cli) -> None:
    """``--json`` prints one object in the public schema; exit 0."""
    proc = run_cli("analyze", str(nvrx / "lock_gil_1st"), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["verdict"] == "hang"
    assert out["ranks_loaded"] == 16 and out["world_size"] == 16 and out["problems"] == []
    assert sorted(c["rank"] for c in out["culprits"]) == [9, 14]
    for c in out["culprits"]:
        assert c["kind"] in {"not_enqueued", "not_completed", "mismatch", "straggler", "missing_dump"}
        assert set(c["process_group"]) == {"name", "desc"}
        assert isinstance(c["collective_seq_id"], int) and c["evidence"]


def test_cli_human_output_is_short_and_answers_first(nvrx: Path, run_cli) -> None:
    """The verdict is the first line and the report stays short."""
    proc = run_cli("analyze", str(nvrx / "gpu_error_1st"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("fr-otel: HANG") and "12,14" in lines[0]
    assert len(lines) < 60  # PyTorch's analyzer prints 262 lines here


def test_missing_dump_of_a_waited_on_rank_is_named(nvrx: Path, tmp_path: Path) -> None:
    """Without rank 9's file, its peers still wait on it: named as missing_dump."""
    src = nvrx / "lock_gil_1st"
    for f in src.glob("_dump_*"):
        if f.name != "_dump_9":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    verdict = analyze(build_job(read_dumps(tmp_path)))
    kinds = {c.rank: c.kind for c in verdict.culprits}
    assert kinds == {9: "missing_dump", 14: "not_enqueued"}
    assert verdict.missing_ranks == (9,)
    assert any("no dump for rank(s) 9" in p for p in verdict.problems)
