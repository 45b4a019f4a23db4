"""Verdicts on a simulated 32-rank Megatron job (TP 2 x PP 4 x DP 4, interleaved 1F1B, distributed
optimizer): snapshots are not hangs, cascades are not culprits, stragglers are judged by role, and
every fault injector is named as its ground truth says. Dumps are made and read in memory
(``support.megatron``), each scenario once per session.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from fr_otel import Verdict
from support.megatron import catalog
from support.megatron.scenarios import Scenario


@cache
def scenario(name: str, *args: object, **kw: object) -> Scenario:
    return getattr(catalog, name)(*args, **kw)


@cache
def verdict_of(name: str, *args: object, dated: bool = True, **kw: object) -> Verdict:
    return scenario(name, *args, **kw).verdict(dated=dated)


def named(v: Verdict) -> dict[int, str]:
    return {c.rank: c.kind for c in v.culprits}


def groups_blamed(v: Verdict, rank: int) -> set[str]:
    """The descs of every group the evidence against ``rank`` names."""
    descs = {g.group.name: g.group.desc for g in v.groups}
    c = next(c for c in v.culprits if c.rank == rank)
    return {c.group_desc, *(descs.get(e.group, "") for e in c.related)}


# --- 1. a snapshot is not a hang -------------------------------------------------------------

@pytest.mark.parametrize("phase", [0.1, 0.4, 0.7])
def test_a_healthy_job_dumped_mid_step_is_healthy_with_the_ages_in_the_evidence(phase: float) -> None:
    """Sends waiting for their recv, the last stage behind, completions not yet seen: healthy, not hang."""
    v = verdict_of("healthy_snapshot", phase)
    assert (v.verdict, named(v)) == ("healthy", {})
    assert v.ages is not None and v.ages.known and v.ages.young > 0 and v.ages.stuck == 0
    age, _, _ = v.ages.oldest_young  # type: ignore[misc]
    assert 0 < age < v.ages.threshold_s
    assert any("none older than normal" in n and "a stall needs" in n for n in v.notes)


@pytest.mark.parametrize("phase", [0.4, 0.9])
def test_a_healthy_job_dumped_mid_step_with_only_active_entries_is_healthy(phase: float) -> None:
    """Only the in-flight tail, no history to learn the pace from (nor stragglers: nothing completed
    there): the default threshold says healthy."""
    v = verdict_of("healthy_snapshot", phase, only_active=True)
    assert (v.verdict, named(v)) == ("healthy", {})
    assert v.ages is not None and v.ages.wait_s is None and v.ages.threshold_s == 60.0


#: Points of the last step (its share of the step) a snapshot is pulled at: the forward warm-up, steady 1F1B,
#: the backward cool-down, the distributed optimizer (reduce_scatter, grad norm, all_gather) and the step's end.
STEP_POINTS = {"warm-up": 0.02, "steady-1F1B": 0.3, "cool-down": 0.5, "optimizer": 0.75, "step-end": 0.99}


@pytest.mark.parametrize("dated", [True, False], ids=["dated", "undated"])
@pytest.mark.parametrize("point", STEP_POINTS)
def test_a_healthy_job_dumped_at_any_point_of_a_step_is_never_a_hang(point: str, dated: bool) -> None:
    """Stages at different microbatches, recvs posted with the previous send and pending, tensor-parallel
    all_reduces in flight for milliseconds: healthy with the pull times; without them (copied off the nodes)
    inconclusive, never a hang: ages are measured to the newest activity, and the waits, read as stopped,
    scatter over many ranks and hosts, where a hang's converge."""
    v = verdict_of("healthy_snapshot", STEP_POINTS[point], dated=dated)
    assert (v.verdict, named(v)) == ("healthy" if dated else "inconclusive", {})
    assert v.ages is not None and v.ages.stuck == 0 and v.ages.to_newest_activity is (not dated)
    if not dated:  # a hang dumped at once cannot be ruled out without dump times: never "healthy"
        note = next(n for n in v.notes if n.startswith("no dump time"))
        assert "reads as a snapshot of a running job" in note and "cannot be ruled out" in note and "cp -p" in note


@pytest.mark.parametrize("dated", [True, False], ids=["dated", "undated"])
@pytest.mark.parametrize("phase", [0.2, 0.55, 0.9])
@pytest.mark.parametrize("rank", [3, 11, 19, 27], ids=lambda r: f"stage{r // 8}-rank{r}")
def test_a_data_parallel_straggler_at_any_stage_dumped_mid_step_is_the_only_rank_named(
        rank: int, phase: float, dated: bool) -> None:
    """600 ms of CPU before its reduce_scatter every step, on a rank of each pipeline stage: it alone is named
    (compared with its equals, seq by seq where most hold the seq: not the data-loading ranks of the last stage
    whose newest all_reduces are complete on some equals only), dated or not (undated at the end of the step
    the waits converge on it, and its lateness history says it is late every step: a straggler, not a hang)."""
    v = verdict_of("straggler", rank, phase=phase, dated=dated)
    assert (v.verdict, named(v)) == ("straggler", {rank: "straggler"})
    assert "DATA_PARALLEL_GROUP" in v.culprits[0].evidence
    if not dated and phase == 0.9:  # said as what it is read as, and what it would look like had it stopped
        note = next(n for n in v.notes if n.startswith("no dump time"))
        assert f"converge on rank(s) {rank}" in note and "waiting for a straggler" in note and "a hang on it" in note


@pytest.mark.parametrize("name,args", [("cpu_stop", (10, "dp_rs", 0)), ("mismatch", ("dp",))])
def test_an_undated_hang_whose_ranks_were_all_at_work_is_read_as_stopped_because_its_waits_converge(
        name: str, args: tuple) -> None:
    """Every rank active moments before the newest activity (its ages measured to it would all be young), but
    the waits, counted stuck, converge on the one culprit: the hang's verdict, with a note saying so."""
    v = verdict_of(name, *args, dated=False)
    assert v.verdict == scenario(name, *args).truth.verdict and named(v) == scenario(name, *args).truth.culprits
    note = next(n for n in v.notes if n.startswith("no dump time"))
    assert "converge on rank(s)" in note and "read as stopped when dumped" in note


@pytest.mark.parametrize("rank,nth", [(21, 2), (13, 2), (5, 1)])
def test_a_stage_that_never_posts_its_next_send_recv_is_shown_on_the_pipeline_group(rank: int, nth: int) -> None:
    """Its pipeline neighbour waits in the recv at once; the other replicas' reduce_scatter waits begin half a step
    later (a consequence, though more ranks wait there): the culprit is shown on the pipeline group first, the
    reduce_scatter among the related evidence."""
    v = verdict_of("never_posts_recv", rank, nth)
    c = v.culprits[0]
    assert (v.verdict, c.rank, c.kind) == ("hang", rank, "not_enqueued")
    assert c.group_desc == "PIPELINE_MODEL_PARALLEL_GROUP" and c.op is not None and " " in c.op  # "nccl:recv 1<-2"
    assert any(e.desc == "DATA_PARALLEL_GROUP" and e.op and "reduce_scatter" in e.op for e in c.related)


def test_a_consistent_straggler_dumped_mid_step_is_a_straggler_naming_only_it() -> None:
    """600 ms of CPU before its reduce_scatter every step: its peers' waits are normal here, it is named."""
    v = verdict_of("straggler")
    assert (v.verdict, named(v)) == ("straggler", {11: "straggler"})
    assert "_reduce_scatter_base" in v.culprits[0].evidence and "DATA_PARALLEL_GROUP" in v.culprits[0].evidence


def test_the_same_job_stuck_for_thirty_seconds_is_a_hang() -> None:
    """Ages well past the job's pace: a hang, and the ages say so."""
    v = verdict_of("cpu_stop")
    assert v.verdict == "hang"
    assert v.ages is not None and v.ages.stuck > 0 and v.ages.oldest_stuck[0] > 25  # type: ignore[index]


def test_a_snapshot_written_to_files_is_dated_by_the_files_and_healthy(tmp_path: Path, run_cli) -> None:
    """From disk, each dump's file time is its pull time: `fr-otel analyze --json` says healthy."""
    folder = scenario("healthy_snapshot", 0.4).write(tmp_path / "dumps")
    proc = run_cli("analyze", str(folder), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["verdict"], out["culprits"]) == ("healthy", [])
    assert out["ages"]["known"] and out["ages"]["stuck"] == 0 and out["ages"]["oldest_young"]["age_s"] > 0


# --- 2. cascades are not culprits --------------------------------------------------------------

@pytest.mark.parametrize("kind,rank", [("coalesced", 30), ("plain", 21)])
def test_a_mismatch_names_only_the_minority_and_everyone_else_waits_on_it(kind: str, rank: int) -> None:
    """The hung collective's members and the pipeline behind it wait on the minority; none is a culprit."""
    v = verdict_of("mismatch", kind, rank)
    assert (v.verdict, named(v)) == ("desync", {rank: "mismatch"})
    waiting = {r for w in v.waiting for r in w.ranks}
    assert all(w.waits_on == (rank,) for w in v.waiting)
    assert len(waiting) >= 7 and rank not in waiting
    assert v.to_dict()["waiting"][0]["text"] == f"waits on rank {rank}"
    assert not any("cycle" in n for n in v.notes)


def test_a_truncated_dump_of_a_rank_that_kept_pace_is_unknown_not_blamed() -> None:
    """Rank 11's dump is cut short; its peers show it kept pace until its TP peer 10 stopped: unknown."""
    s = scenario("truncated_bystander")
    v = verdict_of("truncated_bystander")
    assert (v.verdict, named(v)) == ("hang", {10: "not_enqueued", 11: "unknown"})
    assert [c.rank for c in v.blamed] == [10]
    unknown = v.to_dict()["culprits"][1]
    assert unknown["kind"] == "unknown" and unknown["waits_on"] == [10]
    assert "kept pace" in unknown["evidence"] and "reported, not blamed" in unknown["evidence"]
    assert any("nccl_trace_rank_node01_11" in p and "truncated" in p for p in v.problems)
    assert s.truth.unknown == (11,)


def test_a_dead_node_without_dumps_is_missing_dump_where_that_is_the_best_explanation() -> None:
    """A whole stage's node dies: no proven culprit shares its groups, so its ranks are missing_dump."""
    v = verdict_of("dead_node")
    assert v.verdict == "hang" and named(v) == {r: "missing_dump" for r in range(16, 24)}


def test_waiting_ranks_are_listed_once_each_with_the_culprit_they_wait_on() -> None:
    """Two independent faults: every waiting rank ends at one of the two, and neither culprit waits."""
    v = verdict_of("two_faults")
    assert named(v) == {9: "not_enqueued", 22: "not_completed"}
    listed = [r for w in v.waiting for r in w.ranks]
    assert len(listed) == len(set(listed)) and not {9, 22} & set(listed)
    assert {t for w in v.waiting for t in w.waits_on} == {9, 22}


# --- 3. stragglers by role -----------------------------------------------------------------------

def test_data_loading_on_tensor_parallel_rank_0_is_late_by_design_not_a_straggler() -> None:
    """Dumped with nothing in flight: the loaders of the first and last stages are not named, rank 11 is."""
    v = verdict_of("quiescent")
    assert (v.verdict, named(v)) == ("straggler", {11: "straggler"})


def test_a_data_loader_late_among_its_equals_is_a_straggler() -> None:
    """Rank 24 loads data (late by design) and is 600 ms later still: named, compared with its equals."""
    v = verdict_of("straggler", 24, phase=0.2)
    assert (v.verdict, named(v)) == ("straggler", {24: "straggler"})


def test_two_equally_slow_ranks_each_get_the_collective_they_slowed_at() -> None:
    """A slow host: host 1's two ranks slow down from step 12, each last about half the time: both
    named, each with the first slow all_reduce as its onset."""
    s = scenario("slow_host", steps=36)
    v = verdict_of("slow_host", steps=36)
    onset = s.first_seq(2, "dp_rs", 12)
    assert (v.verdict, named(v)) == ("straggler", {2: "straggler", 3: "straggler"})
    assert [c.collective_seq_id for c in v.culprits] == [onset, onset]
    assert all(f"since #{onset}" in c.evidence for c in v.culprits)


# --- every injector against its ground truth --------------------------------------------------

INJECTORS = [
    ("gpu_stall", (), {}),
    ("gpu_stall", (), {"only_active": True}),
    ("gpu_stall", (), {"after_s": 600.0}),
    ("cpu_stop", (), {}),
    ("cpu_stop", (), {"only_active": True}),
    ("cpu_stop", (10, "dp_rs", 0), {}),
    ("cpu_stop", (0, "get_batch", 0), {}),
    ("never_posts_recv", (), {}),
    ("dead_node", (), {}),
    ("two_faults", (), {}),
    ("mismatch", ("plain",), {}),
    ("mismatch", ("coalesced",), {}),
    ("mismatch", ("dp",), {}),
    ("straggler", (), {}),
    ("truncated_bystander", (), {}),
]


@pytest.mark.parametrize("dated", [True, False], ids=["dated", "undated"])
@pytest.mark.parametrize("name,args,kw", INJECTORS, ids=lambda x: x if isinstance(x, str) else "-".join(map(str, x))
                         if isinstance(x, tuple) else "-".join(f"{k}={v}" for k, v in x.items()))
def test_every_injector_is_named_as_its_ground_truth_says(name: str, args: tuple, kw: dict, dated: bool) -> None:
    """Verdict, culprits and kinds exact; the root's evidence names the group the fault hit, at its step; the same
    from dumps that lost their pull times (a hang's waits converge on its culprits)."""
    s = scenario(name, *args, **kw)
    v = verdict_of(name, *args, dated=dated, **kw)
    truth = s.truth
    assert v.verdict == truth.verdict
    assert named(v) == {**truth.culprits, **{r: "unknown" for r in truth.unknown}}
    for rank, kind in truth.culprits.items():
        if kind in ("missing_dump", "straggler") or truth.group_desc is None:
            continue
        assert truth.group_desc in groups_blamed(v, rank)
        c = next(c for c in v.culprits if c.rank == rank)
        if c.group_desc == truth.group_desc and c.collective_seq_id is not None:
            assert s.step_of(c.group_name, c.collective_seq_id) == truth.step


def test_the_simulator_writes_the_fields_real_nccl_dumps_hold(nvrx: Path) -> None:
    """Every key of a real NCCL dump's entries (NVIDIA's, torch 2.9 layout) and torch 2.13's top level."""
    from fr_otel.read.safe_pickle import load_restricted
    from support.megatron.recorder import dump_dict

    real, _ = load_restricted((nvrx / "gpu_error_1st" / "_dump_12").read_bytes())
    s = scenario("gpu_stall")
    made = dump_dict(s.run, 12, s.dump_at[12], capacity=s.capacity)
    assert set(made) == {"version", "comm_lib_version", "pg_config", "pg_status", "entries"} and made["version"] == "2.10"
    assert set(made["entries"][0]) == set(real["entries"][0]) | {"frames"}
    assert {type(k) for k in made["pg_status"]} == {type(k) for k in real["pg_status"]} == {str}
    assert set(next(iter(made["pg_status"].values()))) == set(next(iter(real["pg_status"].values())))
    assert set(next(iter(made["pg_config"].values()))) == {"name", "desc", "ranks"}


def test_a_host_late_most_of_the_time_from_one_step_on_is_named_with_its_onset() -> None:
    """A host whose CPU quota runs out now and then: from step 12 its two ranks are 0-160 ms late, a
    quarter of the collectives under the 50 ms threshold (the 3-host lab measured 72-78 % over it):
    both named, each with its onset and how many of the collectives since were late, as the live
    slow-host signal names them."""
    s = scenario("slow_host", steps=36, extra_s=0.08, spread_s=0.08)
    v = verdict_of("slow_host", steps=36, extra_s=0.08, spread_s=0.08)
    onset = s.first_seq(2, "dp_rs", 12)
    assert (v.verdict, named(v)) == ("straggler", {2: "straggler", 3: "straggler"})
    assert [c.collective_seq_id for c in v.culprits] == [onset, onset]
    assert all(f"since #{onset}" in c.evidence and "of the last" in c.evidence for c in v.culprits)


# What the 3-host lab's throttled host (5 % of a CPU, 100 ms quota period, 50 ms of data loading a step) makes
# its ranks in turn: 40-45 ms late (under the 50 ms threshold) as often as 90 ms or more.
QUOTA_BURSTS = (0.0, 0.04, 0.04, 0.045, 0.09, 0.14, 0.24)


def test_a_host_late_in_quota_bursts_in_every_collective_an_incident_sends_is_named_by_what_it_costs() -> None:
    """Throttled all through the window an incident sends (its last 64 collectives): each rank's median
    lateness is under the threshold, yet each is late in 3 of 7 collectives and ~85 ms on average, which
    is what the others wait for: both named, late all along, with the mean in the evidence."""
    v = verdict_of("slow_host", from_step=0, steps=40, extra_s=QUOTA_BURSTS, spread_s=0.0)
    assert (v.verdict, named(v)) == ("straggler", {2: "straggler", 3: "straggler"}), [c.evidence for c in v.culprits]
    for c in v.culprits:
        assert c.collective_seq_id is None and "recent" in c.evidence, c.evidence
        median, mean = (int(re.search(rf"{what} (\d+) ms", c.evidence).group(1)) for what in ("median", "mean"))
        assert median < 50 <= mean, c.evidence


def test_a_rank_late_now_and_then_is_no_straggler() -> None:
    """One collective in ten 600 ms late (a GC pause, a checkpoint's flush): 60 ms on average, but late in too
    few of them to be bursty: nobody is named."""
    v = verdict_of("slow_host", from_step=0, steps=40, extra_s=(0.0,) * 9 + (0.6,), spread_s=0.0)
    assert named(v) == {}, [c.evidence for c in v.culprits]


def test_a_host_slow_once_and_on_time_since_is_no_straggler_now() -> None:
    """Host 1's ranks 200 ms late for the first 9-12 steps of the window (each takes the turns from a place of its
    own), on time for the rest: over the window late in a quarter of it or more, 45-60 ms on average, but not in
    its recent half: nobody is named."""
    v = verdict_of("slow_host", from_step=0, steps=40, extra_s=(0.2,) * 18 + (0.0,) * 40, spread_s=0.0)
    assert named(v) == {}, [c.evidence for c in v.culprits]


def test_two_hiccups_among_the_last_collectives_make_no_onset() -> None:
    """Rank 2 300 ms late in the fifth and third last steps, on time before: since that change point late in two
    of five, 120 ms on average, but two late collectives are no straggler."""
    v = verdict_of("slow_host", from_step=35, steps=40, extra_s=(0.0, 0.3, 0.0, 0.3, 0.0), spread_s=0.0)
    assert named(v) == {}, [c.evidence for c in v.culprits]
