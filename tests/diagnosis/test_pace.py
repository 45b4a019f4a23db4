"""The one rule for "stuck, not busy" (diagnosis.pace): the threshold, the pace it is learnt from,
and when a dump's own time can be believed. Dumps built in memory, no torch."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fr_otel import build_job
from fr_otel.agent.observe.poller import stall_threshold_s as agent_threshold
from fr_otel.diagnosis.pace import DAY_NS, dumped_at_ns, learn_pace, stall_threshold_s
from fr_otel.read.dump import RankDump
from fr_otel.read.dump_file import parse_dump_bytes
from fr_otel.read.reader import ReadResult
from fr_otel.testing.dump_builder import DumpBuilder


def test_a_stall_is_well_past_the_pace_never_under_a_second_never_past_half_the_timeout() -> None:
    """3x the longest normal wait, at least 1 s, at most half the op's own timeout."""
    assert stall_threshold_s(None, 2.0) == 6.0
    assert stall_threshold_s(None, 0.01) == 1.0
    assert stall_threshold_s(600_000, 500.0) == 300.0
    assert stall_threshold_s(10_000, 2.0) == 5.0


def test_without_a_pace_the_agents_default_applies_and_the_agent_uses_the_same_rule() -> None:
    """No history: the agent's 60 s (or its configured stall_seconds), capped by the timeout, live and offline."""
    assert stall_threshold_s() == 60.0
    for stall_seconds, timeout_ms in [(60, 600_000), (60, 30_000), (60, None), (5, 600_000)]:
        assert agent_threshold(stall_seconds, timeout_ms) == stall_threshold_s(timeout_ms, None, stall_seconds)


@pytest.mark.parametrize("written_after_s,known", [(0.0, True), (30.0, True), (-1.0, False), (2 * 86_400, False)])
def test_a_dump_is_dated_only_by_a_believable_time(written_after_s: float, known: bool) -> None:
    """At or after the dump's last activity and within a day of it; a copy dated later (or earlier) is not."""
    latest = 1_760_000_000 * 10**9
    dump = RankDump(0, "rank_0", "2.10", "nccl", "", {}, {}, latest_ns=latest,
                    file_mtime_ns=latest + int(written_after_s * 1e9))
    assert (dumped_at_ns(dump) is not None) is known
    assert DAY_NS == 86_400 * 10**9


def test_the_pace_is_learnt_from_arrivals_timed_runs_and_pauses() -> None:
    """Rank 2 arrives 300 ms late once: the longest normal wait is 0.3 s; NCCL's completion times give the runs."""
    b = DumpBuilder(4)
    for i in range(20):
        b.collective(b.world, late_s={2: 0.3} if i == 7 else {})
    read = ReadResult()
    for r in range(4):
        dump = parse_dump_bytes(b.dump(r), r, f"rank_{r}", dumped_at_ns=b.clock + 10**9)
        assert dump is not None
        read.dumps[r] = dump
    pace = learn_pace(build_job(read))
    assert pace.wait_s == pytest.approx(0.3)
    assert pace.run_s == pytest.approx(0.0005)
    assert pace.pause_s is not None and pace.pause_s >= 0.001
    assert pace.normal_s == pytest.approx(0.3)
    assert "waited up to 0.30 s" in pace.describe()


def test_incidents_raised_as_the_job_ends_count_every_wait_whatever_its_age() -> None:
    """An uncaught exception or SIGTERM ends the job: its peers' young waits are for good (a hang);
    a stall or an on-demand flush is a snapshot whose ages are weighed."""
    from fr_otel import analyze
    from fr_otel.diagnosis.verdict import AnalysisOptions
    from fr_otel.incident.trigger import Reason

    assert Reason.of("uncaught RuntimeError: injected failure at step 5").ends_job and Reason.of("SIGTERM").ends_job
    assert not Reason.of("stall").ends_job and not Reason.of("manual").ends_job
    b = DumpBuilder(4)
    for _ in range(5):
        b.collective(b.world)
    b.collective(b.world, ranks=[0, 2, 3], done=False)  # rank 1 raised before its all_reduce, 0.1 s ago
    read = ReadResult()
    for r in range(4):
        read.dumps[r] = parse_dump_bytes(b.dump(r), r, f"rank_{r}", dumped_at_ns=b.clock + 10**8)  # type: ignore[assignment]
    snapshot = analyze(build_job(read))
    ending = analyze(build_job(read), AnalysisOptions(ending=True))
    assert (snapshot.verdict, snapshot.culprits) == ("healthy", [])
    assert ending.verdict == "hang" and [(c.rank, c.kind) for c in ending.culprits] == [(1, "not_enqueued")]


def _dumped(b: DumpBuilder, dumped: int, folder: Path | None) -> ReadResult:
    """The builder's 4 ranks as read at ``dumped`` (and written to ``folder``, dated then)."""
    read = ReadResult()
    for r in range(4):
        if folder is not None:
            path = folder / f"rank_{r}"
            path.write_bytes(b.dump(r))
            os.utime(path, ns=(dumped, dumped))
        read.dumps[r] = parse_dump_bytes(b.dump(r), r, f"rank_{r}", dumped_at_ns=dumped)  # type: ignore[assignment]
    return read


def _late_start_stall(folder: Path | None = None) -> ReadResult:
    """Rank 2 started 3 s after the others (the job's first all_reduce waited for it), then never enqueued
    the 6th all_reduce; the dumps are taken 6 s into that wait (and written to ``folder``, dated then)."""
    b = DumpBuilder(4)
    b.collective(b.world, late_s={2: 3.0})
    b.clock += 3 * 10**9
    for _ in range(4):
        b.collective(b.world)
    b.collective(b.world, ranks=[0, 1, 3], done=False)
    return _dumped(b, b.clock + 6 * 10**9, folder)


def test_a_live_stall_incident_counts_the_wait_it_was_raised_for_whatever_the_learnt_pace() -> None:
    """The late start makes the learnt pace ask 9 s of a stall, so a snapshot of the 6 s wait is healthy; the
    live agent raised its incident over a 5 s threshold for that wait: then the verdict names rank 2."""
    from fr_otel import analyze
    from fr_otel.diagnosis.verdict import AnalysisOptions

    read = _late_start_stall()
    snapshot = analyze(build_job(read))
    assert (snapshot.verdict, snapshot.culprits, snapshot.ages.threshold_s) == ("healthy", [], pytest.approx(9.0, abs=0.01))
    live = analyze(build_job(read), AnalysisOptions(raised_over_s=5.0))
    assert live.verdict == "hang" and [(c.rank, c.kind) for c in live.culprits] == [(2, "not_enqueued")]
    assert live.ages.threshold_s == 5.0
    young = analyze(build_job(read), AnalysisOptions(raised_over_s=30.0))  # never raises the learnt bar
    assert young.verdict == "healthy" and young.ages.threshold_s == pytest.approx(9.0, abs=0.01)


def test_a_rank_that_left_never_enqueues_the_wait_however_early_its_last_recorder_was_taken() -> None:
    """Rank 2 left the loop and exited; its exit copy was taken 0.5 s into its peers' 6th all_reduce, their
    dumps 6 s into it. A laggard dumped early bounds how long the wait had lasted, but one that has left never
    enqueues it: a stall incident over 3 s names it. Without its exit record, the same early dump is a
    snapshot of a 0.5 s wait (seen: CI read an early exit as inconclusive when a stall, not a failure, raised it)."""
    import pickle

    from fr_otel import analyze
    from fr_otel.diagnosis.verdict import AnalysisOptions
    from fr_otel.read.rank_facts import EXIT_KEY

    b = DumpBuilder(4)
    for _ in range(5):
        b.collective(b.world)
    b.collective(b.world, ranks=[0, 1, 3], done=False)
    created = b.clock
    for left in (True, False):
        read = ReadResult()
        for r in range(4):
            raw = b.dump(r)
            at = created + (5 * 10**8 if r == 2 else 6 * 10**9)  # the stall threshold learnt here: 1 s
            if r == 2 and left:
                raw = pickle.dumps({**pickle.loads(raw), EXIT_KEY: {"how": "exit", "at_ns": created}})
            read.dumps[r] = parse_dump_bytes(raw, r, f"rank_{r}", dumped_at_ns=at)  # type: ignore[assignment]
        found = analyze(build_job(read), AnalysisOptions(raised_over_s=3.0))
        if left:
            assert found.verdict == "hang" and [(c.rank, c.kind) for c in found.culprits] == [(2, "not_enqueued")]
        else:
            assert found.verdict != "hang" and not found.culprits, found.verdict


@pytest.mark.parametrize(("root", "verdict"), [
    ((("fr_otel.incident.reason", "stall"), ("fr_otel.incident.detected.threshold_s", 5.0)), "hang"),
    ((("fr_otel.incident.reason", "manual"), ("fr_otel.incident.detected.threshold_s", 5.0)), "healthy"),
    ((("fr_otel.incident.reason", "stall"),), "healthy"),
])
def test_offline_analysis_of_the_incident_folder_says_what_the_live_stall_verdict_said(
        tmp_path: Path, run_cli, root: tuple[tuple[str, object], ...], verdict: str) -> None:
    """`fr-otel analyze` of the dumps with the incident.json a stall incident leaves (reason and threshold)
    names rank 2 as the live agent did; another reason, or no threshold, is weighed as a snapshot."""
    _late_start_stall(tmp_path)
    doc = _analyze_as_incident(tmp_path, run_cli, root)
    assert doc["verdict"] == verdict
    assert [c["rank"] for c in doc["culprits"]] == ([2] if verdict == "hang" else [])


def _analyze_as_incident(folder: Path, run_cli, root: tuple[tuple[str, object], ...]) -> dict[str, object]:
    """`fr-otel analyze --json` of ``folder``'s dumps beside the incident.json a live incident with ``root`` leaves."""
    from fr_otel.common.ids import trace_id_for
    from fr_otel.incident.files import write_identity
    from fr_otel.read.incident_file import IncidentIdentity

    write_identity(folder, IncidentIdentity(job_id="job-1", incident="1", trace_id=f"{trace_id_for('job-1', '1'):032x}",
                                            root_attributes=root))
    proc = run_cli("analyze", str(folder), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _rank0_held_up_others(folder: Path | None = None) -> ReadResult:
    """A fast job (steps of milliseconds) whose rank 0 has not enqueued the 21st all_reduce that ranks 1-3 entered
    2 s before the dumps (written to ``folder``, dated then): past any stall the learnt pace asks (1 s at least),
    well short of the agent's."""
    b = DumpBuilder(4)
    for _ in range(20):
        b.collective(b.world)
    b.collective(b.world, ranks=[1, 2, 3], done=False)
    return _dumped(b, b.clock + 2 * 10**9, folder)


def test_a_slow_host_incident_raised_while_the_job_ran_calls_no_wait_younger_than_the_agents_stall_a_hang() -> None:
    """A slow-host incident's ranks are dumped while the job runs; a rank starved of CPU for 2 s (its coordinator's
    own work on a loaded box) holds the others up past the learnt pace, not past the agent's 60 s stall threshold
    that it was raised under: not a hang (the snapshot alone still says hang)."""
    from fr_otel import analyze
    from fr_otel.diagnosis.verdict import AnalysisOptions

    read = _rank0_held_up_others()
    snapshot = analyze(build_job(read))
    assert snapshot.verdict == "hang" and [c.rank for c in snapshot.culprits] == [0]
    running = analyze(build_job(read), AnalysisOptions(running_stall_s=60.0))
    assert running.verdict != "hang" and running.culprits == [] and running.ages.threshold_s == 60.0


@pytest.mark.parametrize(("root", "verdict"), [
    ((("fr_otel.incident.reason", "slow: host node1 holds up group 0 (default_pg)"),
      ("fr_otel.incident.detected.threshold_s", 60.0)), "healthy"),
    ((("fr_otel.incident.reason", "slow: host node1 holds up group 0 (default_pg)"),), "hang"),
    ((("fr_otel.incident.reason", "manual"), ("fr_otel.incident.detected.threshold_s", 60.0)), "hang"),
])
def test_offline_analysis_of_a_slow_host_incident_folder_weighs_waits_as_the_agent_did(
        tmp_path: Path, run_cli, root: tuple[tuple[str, object], ...], verdict: str) -> None:
    """`fr-otel analyze` of a slow-host incident's folder (its reason and the agent's stall threshold) calls the
    2 s wait no hang; without the threshold, or for another reason, the snapshot's own pace decides."""
    _rank0_held_up_others(tmp_path)
    assert _analyze_as_incident(tmp_path, run_cli, root)["verdict"] == verdict


def test_a_slow_host_incident_counts_a_wait_whose_age_a_compact_recorder_cannot_tell_as_no_stall() -> None:
    """Node leaders send compact recorders (no enqueue times): a wait's age is then unknown, which a snapshot counts
    as stuck; in a slow-host incident, raised while no agent had raised a stall, it is not (seen live: a straggler
    incident came out 'hang' from a summary's unknown ages)."""
    from fr_otel import analyze
    from fr_otel.diagnosis.pace import Clock
    from fr_otel.diagnosis.verdict import AnalysisOptions

    job = build_job(_rank0_held_up_others())
    assert Clock.of(job).stuck(None, 1) and not Clock.of(job, running_stall_s=60.0).stuck(None, 1)
    assert Clock.of(job).past(None) and not Clock.of(job, running_stall_s=60.0).past(None)
    undated = ReadResult()  # dumps with no time at all: every age unknown
    for r, d in _rank0_held_up_others().dumps.items():
        d.file_mtime_ns = None
        undated.dumps[r] = d
    assert analyze(build_job(undated)).verdict == "hang"
    assert analyze(build_job(undated), AnalysisOptions(running_stall_s=60.0)).verdict != "hang"


def test_undated_dumps_are_measured_to_the_newest_activity_only_when_every_rank_was_at_work() -> None:
    """A snapshot copied without its dates: every rank active within half a usual longest pause of the newest
    activity, ages measured to it. Not so when a rank went quiet first (a hang), a rank left no dump, or the
    history is too short to learn a rhythm from (then every undated wait counts as stuck, as before)."""
    from support.megatron import catalog

    from fr_otel.diagnosis.pace import AT_WORK_FRACTION, AT_WORK_HISTORY, Clock, at_work_until

    snapshot = build_job(catalog.healthy_snapshot(0.4).read(dated=False))
    pace = learn_pace(snapshot)
    newest = max(d.latest_ns for d in snapshot.dumps.values())
    assert at_work_until(snapshot.dumps, pace) == newest
    clock = Clock.of(snapshot)
    assert clock.at_work_ns == newest and set(clock.dumped.values()) == {newest}
    assert not Clock.of(snapshot, infer=False).dumped and not Clock.of(snapshot, weigh=False).dumped
    assert Clock.of(snapshot, raised_over_s=10.0).at_work_ns is None  # a live incident's stall was no snapshot
    quiet = max(newest - d.latest_ns for d in snapshot.dumps.values()) / 1e9
    assert pace.pause_s is not None and quiet <= AT_WORK_FRACTION * pace.pause_s

    hang = build_job(catalog.cpu_stop().read(dated=False))  # rank 10 went quiet first
    hang_pace = learn_pace(hang)
    assert hang_pace.pause_s is not None and at_work_until(hang.dumps, hang_pace) is None
    assert Clock.of(hang).at_work_ns is None

    dead = build_job(catalog.dead_node().read(dated=False))  # a node's ranks left no dump
    assert dead.missing_ranks and Clock.of(dead).at_work_ns is None

    b = DumpBuilder(4)  # a few collectives: no rhythm to speak of
    for _ in range(AT_WORK_HISTORY - 1):
        b.collective(b.world)
    short = ReadResult()
    for r in range(4):
        short.dumps[r] = parse_dump_bytes(b.dump(r), r, f"rank_{r}", dumped_at_ns=None)  # type: ignore[assignment]
    short_job = build_job(short)
    assert at_work_until(short_job.dumps, learn_pace(short_job)) is None


def test_an_undated_snapshot_on_disk_is_inconclusive_in_analyze_json_with_its_lower_bound_ages(
        tmp_path: Path, run_cli) -> None:
    """The files dated two days after their last activity (copied later): `fr-otel analyze --json` blames no
    one and says inconclusive (a hang dumped at once cannot be ruled out), ages measured to the newest activity,
    and the note says why and what would settle it."""
    from support.megatron import catalog

    folder = catalog.healthy_snapshot(0.3).write(tmp_path / "dumps")
    for path in folder.iterdir():
        later = path.stat().st_mtime_ns + 2 * DAY_NS
        os.utime(path, ns=(later, later))
    proc = run_cli("analyze", str(folder), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["verdict"], out["culprits"]) == ("inconclusive", [])
    assert out["ages"]["to_newest_activity"] and out["ages"]["stuck"] == 0 and not out["ages"]["known"]
    assert any(n.startswith("no dump time") and "rsync -t" in n for n in out["notes"])


def test_an_undated_hang_inside_one_collective_every_rank_entered_is_never_healthy() -> None:
    """Forty healthy all_reduces, then one every rank entered and none completed (a network or device fault
    inside it), dumps copied without their dates: every rank was active moments before the newest activity, but
    read as stopped the collective is stuck with no rank to single out: inconclusive, not healthy."""
    from fr_otel import analyze
    from fr_otel.diagnosis.pace import Clock

    b = DumpBuilder(4)
    for _ in range(40):
        b.collective(b.world)
    b.collective(b.world, done=False)
    read = ReadResult()
    for r in range(4):
        read.dumps[r] = parse_dump_bytes(b.dump(r), r, f"rank_{r}", dumped_at_ns=None)  # type: ignore[assignment]
    job = build_job(read)
    assert Clock.of(job).at_work_ns is not None  # the at-work reading applies
    v = analyze(job)
    assert v.verdict == "inconclusive" and v.culprits == []
    assert any("none completed" in n for n in v.notes)
    assert any(n.startswith("no dump time") and "read as stopped when dumped" in n for n in v.notes)
