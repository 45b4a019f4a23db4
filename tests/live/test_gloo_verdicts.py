"""Real hangs: 4-rank gloo jobs under torch 2.13 CPU, each rank's recorder pulled while stuck.

Every scenario runs once per session (a real job takes a few seconds) and is analysed
from both its pickle and its JSON dumps: the verdict and culprits must be exact.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fr_otel import Verdict, analyze, build_job, read_dumps
from fr_otel.diagnosis.restart import calls_for_restart, hosts_to_exclude

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the torch extra"),
]



def verdicts(folder: Path) -> list[Verdict]:
    """The verdict from the pickles and from the JSON dumps of the same job."""
    return [analyze(build_job(read_dumps(folder / fmt))) for fmt in ("pickle", "json")]


def summary(v: Verdict) -> tuple[str, list[tuple[int, str, str, int | None]]]:
    return v.verdict, [(c.rank, c.kind, c.group_desc, c.collective_seq_id) for c in v.culprits]


def test_rank_skips_an_allreduce(scenario_dumps) -> None:
    """Rank 2 never enqueues world all_reduce #6; ranks 0, 1, 3 wait in it."""
    for v in verdicts(scenario_dumps("skip_allreduce")):
        assert summary(v) == ("hang", [(2, "not_enqueued", "default_pg", 6)])
        assert calls_for_restart(v)  # FR_OTEL_ON_HANG=abort may end the ranks stuck in it
        assert v.culprits[0].waiting_ranks == (0, 1, 3)
        assert v.problems == [] and v.ranks_loaded == 4 and v.world_size == 4


def test_skip_evidence_and_stack_from_pickle(scenario_dumps) -> None:
    """The pickle carries stacks: the culprit's last call site is in the job's own code."""
    pickled, from_json = verdicts(scenario_dumps("skip_allreduce"))
    frame = pickled.culprits[0].last_frame
    assert frame is not None and frame.filename.endswith("catalog.py")
    assert from_json.culprits[0].last_frame is None  # JSON dumps hold no frames
    assert "rank(s) 0-1,3 wait in all_reduce #6" in pickled.culprits[0].evidence


def test_subgroup_stall_blames_only_the_stalled_rank(scenario_dumps) -> None:
    """Rank 3 stalls in subgroup {2,3}; rank 2 waits on it there and is not accused,
    although it is as absent from the world all_reduce as rank 3."""
    for v in verdicts(scenario_dumps("subgroup_stall")):
        verdict, culprits = summary(v)
        assert verdict == "hang"
        assert [(r, k) for r, k, _, _ in culprits] == [(3, "not_enqueued")]
        c = v.culprits[0]
        group = next(g.group for g in v.groups if g.group.name == c.group_name)
        assert group.ranks == (2, 3) and c.waiting_ranks == (2,)
        world = next(g for g in v.groups if g.group.desc == "default_pg")
        assert world.in_flight is not None and world.in_flight.not_entered == (2, 3)


def test_different_op_at_same_sequence_number(scenario_dumps) -> None:
    """Rank 1 calls broadcast where ranks 0, 2, 3 call all_reduce: the minority is the culprit."""
    for v in verdicts(scenario_dumps("op_mismatch")):
        verdict, culprits = summary(v)
        assert verdict == "desync"
        assert culprits == [(1, "mismatch", "default_pg", 4)]
        assert "broadcast" in v.culprits[0].evidence and "all_reduce" in v.culprits[0].evidence


def test_same_numel_different_shape(scenario_dumps) -> None:
    """Gloo lets (2, 8) meet (4, 4) (same bytes); the recorder still shows the mismatch."""
    for v in verdicts(scenario_dumps("shape_mismatch")):
        assert summary(v) == ("desync", [(3, "mismatch", "default_pg", 4)])
        assert "[2,8]" in v.culprits[0].evidence and "[4,4]" in v.culprits[0].evidence


def test_straggler(scenario_dumps) -> None:
    """No hang; rank 1 enqueues every collective ~0.25 s after its peers."""
    for v in verdicts(scenario_dumps("straggler")):
        verdict, culprits = summary(v)
        assert verdict == "straggler"
        assert [(r, k) for r, k, _, _ in culprits] == [(1, "straggler")]
        assert all(g.in_flight is None for g in v.groups)
        assert not calls_for_restart(v) and hosts_to_exclude(v) == ()  # slow is not stuck: never aborted


def test_healthy_run(scenario_dumps) -> None:
    """Everything completed, no skew, no mismatch: healthy, nobody accused."""
    for v in verdicts(scenario_dumps("healthy")):
        assert summary(v) == ("healthy", [])
        assert not calls_for_restart(v)


def test_gloo_pg_config_is_unsound_and_membership_is_inferred(scenario_dumps) -> None:
    """torch 2.13 gloo records pg_config as {'': ...}: groups come from the entries."""
    folder = scenario_dumps("subgroup_stall")
    job = build_job(read_dumps(folder / "pickle"))
    assert all(set(d.pg_config) <= {""} for d in job.dumps.values())
    memberships = sorted((pg.ranks, pg.membership) for pg in job.groups.values())
    assert memberships == [((0, 1), "entries"), ((0, 1, 2, 3), "world"), ((2, 3), "entries")]
    # rank 3's local id for {2, 3} and rank 0's for {0, 1} are both slot 1
    sub_b = next(pg for pg in job.groups.values() if pg.ranks == (2, 3))
    sub_a = next(pg for pg in job.groups.values() if pg.ranks == (0, 1))
    assert sub_b.local_ids[3] == sub_a.local_ids[0] == 1


def test_json_quirks_are_normalised(scenario_dumps) -> None:
    """JSON dumps give counters as strings and 0 for missing times; both read the same."""
    folder = scenario_dumps("skip_allreduce")
    raw = json.loads((folder / "json" / "rank_0.json").read_text())
    assert isinstance(next(iter(raw["pg_status"].values()))["last_enqueued_collective"], str)
    pickled = read_dumps(folder / "pickle").dumps[0]
    from_json = read_dumps(folder / "json").dumps[0]
    assert pickled.pg_status == from_json.pg_status
    strip = lambda e: e._replace(frames=())  # noqa: E731
    assert [strip(e) for e in pickled.entries] == [strip(e) for e in from_json.entries]
    assert all(e.time_completed_ns is None for e in from_json.entries)
