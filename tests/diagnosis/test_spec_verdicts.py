"""The verdict specification, one scenario per row, on dumps built by hand (no torch, seconds).

Each scenario is written by :class:`fr_otel.testing.dump_builder.DumpBuilder` in the
NCCL shape (or gloo's where it says so) and analysed from pickle and from JSON, from
full histories and, where it applies, from only-active dumps: the verdict, the culprits
and their kinds must be exact, and no rank that is only waiting may be accused.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from fr_otel import Verdict, analyze, build_job, read_dumps
from fr_otel.testing.dump_builder import DumpBuilder
from fr_otel.report.text import render_verdict

FORMATS = ("pickle", "json")


def verdicts(builder: DumpBuilder, tmp: Path, *, only_active: tuple[bool, ...] = (False, True),
             omit: tuple[int, ...] = ()) -> list[Verdict]:
    """The verdict from every form of the same job: pickle/JSON x full/only-active."""
    out = []
    for fmt in FORMATS:
        for active in only_active:
            folder = builder.write(tmp / f"{fmt}-{active}", fmt=fmt, only_active=active, omit=omit)
            out.append(analyze(build_job(read_dumps(folder))))
    return out


def blamed(v: Verdict) -> list[tuple[int, str]]:
    return [(c.rank, c.kind) for c in v.culprits]


def warm_up(b: DumpBuilder, steps: int = 3) -> None:
    """Some completed world collectives, as any job has before it hangs."""
    for _ in range(steps):
        b.collective(b.world)


def pipeline_microbatches(b: DumpBuilder, pp: str, stages: list[int], n: int = 2) -> None:
    """Completed forward and backward transfers along a pipeline."""
    for _ in range(n):
        for a, c in zip(stages, stages[1:]):
            b.transfer(pp, a, c, ((4096, 1, 512),), "BFloat16")
        for a, c in zip(stages[::-1], stages[::-1][1:]):
            b.transfer(pp, a, c, ((4096, 1, 512),), "BFloat16")


def pure_pipeline_stall() -> DumpBuilder:
    """4 stages; stage 2 never posts its recv of the next micro-batch."""
    b = DumpBuilder(4)
    pp = b.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1, 2, 3])
    warm_up(b)
    pipeline_microbatches(b, pp, [0, 1, 2, 3])
    b.transfer(pp, 0, 1, ((4096, 1, 512),), "BFloat16")
    b.send(pp, 1, 2, ((4096, 1, 512),), "BFloat16", done=False)  # stage 1 waits in send 1->2
    b.recv(pp, 3, 2, ((4096, 1, 512),), "BFloat16", done=False)  # stage 3 waits in recv 3<-2
    b.recv(pp, 0, 1, ((4096, 1, 512),), "BFloat16", done=False)  # stage 0 waits in its backward recv
    return b


def test_pure_pipeline_stall_blames_the_stage_that_never_posted(tmp_path: Path) -> None:
    """Stage 2 is the only culprit; the evidence names the send and the peer that waits in it."""
    for v in verdicts(pure_pipeline_stall(), tmp_path):
        assert v.verdict == "hang"
        assert blamed(v) == [(2, "not_enqueued")]
        c = v.culprits[0]
        texts = [c.evidence, *(e.text for e in c.related)]
        assert any("send 1->2" in t and "rank 2 never posted the matching recv" in t for t in texts)
        assert any("recv 3<-2" in t for t in texts)
        assert c.op in ("nccl:send 1->2", "nccl:recv 3<-2") and c.peer in (1, 3)
        assert c.group_desc == "PIPELINE_MODEL_PARALLEL_GROUP"


def test_pipeline_under_data_parallelism_blames_one_stage_not_the_whole_pipeline(tmp_path: Path) -> None:
    """2 pipelines x 4 stages: the healthy pipeline waits in the DP all_reduce; only rank 2 is named."""
    b = DumpBuilder(8)
    pa = b.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1, 2, 3])
    pb = b.group("2", "PIPELINE_MODEL_PARALLEL_GROUP", [4, 5, 6, 7])
    dp = [b.group(str(3 + i), "DATA_PARALLEL_GROUP", [i, i + 4]) for i in range(4)]
    warm_up(b)
    for g in dp:
        b.collective(g)
    pipeline_microbatches(b, pa, [0, 1, 2, 3])
    pipeline_microbatches(b, pb, [4, 5, 6, 7], n=3)
    for i, g in enumerate(dp):
        b.collective(g, ranks=[i + 4], done=False)  # pipeline B finished its step
    b.send(pa, 1, 2, done=False)
    b.recv(pa, 3, 2, done=False)
    b.recv(pa, 0, 1, done=False)
    for v in verdicts(b, tmp_path):
        assert v.verdict == "hang"
        assert blamed(v) == [(2, "not_enqueued")]
        assert set(v.culprits[0].waiting_ranks) <= {1, 3, 6}


def test_pipeline_with_tensor_parallelism_follows_the_chain_to_the_stalled_rank(tmp_path: Path) -> None:
    """4 stages x TP 2: rank 4 stalls; its TP peer waits in an all_reduce, the stages around wait in p2p."""
    b = DumpBuilder(8)
    pp0 = b.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 2, 4, 6])
    pp1 = b.group("2", "PIPELINE_MODEL_PARALLEL_GROUP", [1, 3, 5, 7])
    tps = [b.group(str(3 + i), "TENSOR_MODEL_PARALLEL_GROUP", [2 * i, 2 * i + 1]) for i in range(4)]
    warm_up(b)
    for tp in tps:
        b.collective(tp)
    pipeline_microbatches(b, pp0, [0, 2, 4, 6])
    pipeline_microbatches(b, pp1, [1, 3, 5, 7])
    b.collective(tps[2], ranks=[5], done=False)  # rank 5 waits on rank 4 in TP
    b.send(pp0, 2, 4, done=False)
    b.send(pp1, 3, 5, done=False)  # rank 5 never gets to post its recv: it waits in TP
    b.recv(pp0, 6, 4, done=False)
    b.recv(pp1, 7, 5, done=False)
    b.recv(pp0, 0, 2, done=False)
    b.recv(pp1, 1, 3, done=False)
    for v in verdicts(b, tmp_path):
        assert v.verdict == "hang"
        assert blamed(v) == [(4, "not_enqueued")]


def test_interleaved_schedule_pairs_the_kth_send_with_the_kth_recv(tmp_path: Path) -> None:
    """Two pending sends 1->2 meet one posted recv: the first pair is in transfer, the second has no
    recv, so rank 2 is named for it (and rank 1, which posted everything, is not)."""
    b = DumpBuilder(4)
    pp = b.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1, 2, 3])
    warm_up(b)
    pipeline_microbatches(b, pp, [0, 1, 2, 3], n=3)
    b.send(pp, 1, 2, done=False)  # chunk 0 of the next micro-batch
    b.recv(pp, 2, 1, done=False)
    b.send(pp, 1, 2, done=False)  # chunk 1: rank 2 never posted this recv
    for v in verdicts(b, tmp_path):
        assert v.verdict == "hang"
        assert blamed(v) == [(2, "not_enqueued")]
        c = v.culprits[0]
        assert c.op == "nccl:send 1->2" and c.peer == 1 and c.waiting_ranks == (1,)
        assert "rank 2 never posted the matching recv" in c.evidence


def test_send_recv_size_mismatch_is_a_desync_with_both_calls(tmp_path: Path) -> None:
    """A send of [[4]] met by a recv of [[8]], both in flight: desync, both sizes in the evidence."""
    b = DumpBuilder(4)
    pp = b.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1, 2, 3])
    warm_up(b)
    pipeline_microbatches(b, pp, [0, 1, 2, 3])
    b.send(pp, 1, 2, ((4,),), done=False)
    b.recv(pp, 2, 1, ((8,),), done=False)
    for v in verdicts(b, tmp_path):
        assert v.verdict == "desync"
        assert blamed(v) == [(1, "mismatch"), (2, "mismatch")]
        text = v.culprits[0].evidence
        assert "send 1->2 [4] Float" in text and "recv 2<-1 [8] Float" in text


def test_any_source_recv_takes_a_pending_send(tmp_path: Path) -> None:
    """``recv 2<-?`` pairs with rank 1's send to 2; rank 3, which never posted its recv, is named."""
    b = DumpBuilder(4)
    pp = b.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1, 2, 3])
    warm_up(b)
    b.send(pp, 1, 2, done=False)
    b.recv(pp, 2, None, done=False)
    b.send(pp, 1, 3, done=False)
    for v in verdicts(b, tmp_path):
        assert v.verdict == "hang"
        assert blamed(v) == [(3, "not_enqueued")]
        assert "send 1->3" in v.culprits[0].evidence


def test_unmatched_any_source_recv_waits_on_the_group(tmp_path: Path) -> None:
    """Nobody sends to rank 2's ``recv 2<-?``: the member that is stuck elsewhere is named."""
    b = DumpBuilder(3)
    pp = b.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1, 2])
    warm_up(b)
    b.recv(pp, 2, None, done=False)
    b.recv(pp, 1, 0, done=False)  # rank 1 waits on rank 0, rank 0 posts nothing
    for v in verdicts(b, tmp_path):
        assert v.verdict == "hang"
        assert blamed(v) == [(0, "not_enqueued")]


def test_transfer_stuck_on_both_sides_is_inconclusive_never_healthy(tmp_path: Path) -> None:
    """Both sides posted, neither completed, nothing else stuck: inconclusive, with the reason."""
    b = DumpBuilder(2)
    pp = b.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1])
    warm_up(b)
    b.transfer(pp, 0, 1, done=False)
    for v in verdicts(b, tmp_path):
        assert v.verdict == "inconclusive" and v.culprits == []
        assert any("transfer itself is stuck" in n for n in v.notes)


def test_peer_completed_the_transfer_this_rank_did_not(tmp_path: Path) -> None:
    """Rank 1's recv is pending while rank 0 completed the matching send: rank 1's device stalled."""
    b = DumpBuilder(2)
    pp = b.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1])
    warm_up(b)
    b.send(pp, 0, 1, done=True)
    b.recv(pp, 1, 0, done=False)
    for v in verdicts(b, tmp_path, only_active=(False,)):
        assert v.verdict == "hang"
        assert blamed(v) == [(1, "not_completed")]
        assert v.culprits[0].peer == 0


def test_same_name_on_two_member_sets_is_two_groups(tmp_path: Path) -> None:
    """Group "tp" on {0,1} and on {2,3}: not merged; only rank 3 (absent from its own tp) is blamed."""
    b = DumpBuilder(4)
    a = b.group("tp", "tp", [0, 1])
    c = b.group("tp", "tp", [2, 3])
    for _ in range(3):
        b.collective(a)
        b.collective(c)
    b.collective(a)  # {0,1} is one collective ahead of {2,3}: legitimately
    b.collective(c, ranks=[2], done=False)
    for v in verdicts(b, tmp_path):
        assert v.verdict == "hang"
        assert blamed(v) == [(3, "not_enqueued")]
        groups = sorted((g.group.name, g.group.ranks) for g in v.groups)
        assert groups == [("0", (0, 1, 2, 3)), ("tp[0-1]", (0, 1)), ("tp[2-3]", (2, 3))]
        assert v.culprits[0].waiting_ranks == (2,)


def test_coalesced_mismatch_names_the_op_that_differs(tmp_path: Path) -> None:
    """In a coalesced group the evidence shows the third op's sizes on both sides, not the first op."""
    b = DumpBuilder(4)
    warm_up(b)
    ops = [("_broadcast_oop", ((4, 4),), "Float")] * 2 + [("_broadcast_oop", ((8,),), "Float")]
    bad = ops[:2] + [("_broadcast_oop", ((16,),), "Float")]
    b.collective(b.world, coalesced=ops, per_rank={1: {"coalesced": bad}})
    for v in verdicts(b, tmp_path, only_active=(False,)):
        assert v.verdict == "desync" and blamed(v) == [(1, "mismatch")]
        text = v.culprits[0].evidence
        assert "called _broadcast_oop [16] Float (op 3" in text and "called _broadcast_oop [8] Float (op 3" in text


def test_collective_mismatch_blames_the_minority(tmp_path: Path) -> None:
    """Rank 3 calls all_reduce with [8] where the others use [4]: rank 3 alone is named."""
    b = DumpBuilder(4)
    warm_up(b)
    b.collective(b.world, per_rank={3: {"sizes": ((8,),)}}, done=False)
    for v in verdicts(b, tmp_path):
        assert v.verdict == "desync" and blamed(v) == [(3, "mismatch")]


def test_late_straggler_is_named_with_its_onset(tmp_path: Path) -> None:
    """Fine for 10 world collectives, then 300 ms late on each of the last 10 (and on time in its TP
    group throughout): named, the evidence says since #11 and by how much."""
    b = DumpBuilder(4)
    tp = [b.group("1", "tp", [0, 1]), b.group("2", "tp", [2, 3])]
    for i in range(20):
        b.collective(b.world, late_s={3: 0.3} if i >= 10 else {})
        for _ in range(3):
            for g in tp:
                b.collective(g)
    for v in verdicts(b, tmp_path, only_active=(False,)):
        assert v.verdict == "straggler" and blamed(v) == [(3, "straggler")]
        c = v.culprits[0]
        assert c.collective_seq_id == 11 and "since #11" in c.evidence and "300 ms" in c.evidence


def test_steady_straggler_is_still_named(tmp_path: Path) -> None:
    """A rank 250 ms late on every collective: named as before."""
    b = DumpBuilder(4)
    for _ in range(12):
        b.collective(b.world, late_s={1: 0.25})
    for v in verdicts(b, tmp_path, only_active=(False,)):
        assert v.verdict == "straggler" and blamed(v) == [(1, "straggler")]


def _on_hosts(folder: Path, hosts: dict[int, str]) -> Path:
    (folder / "ranks.json").write_text(json.dumps({"version": 1, "world_size": len(hosts), "ranks": {
        str(r): {"host": h, "pid": 100 + r} for r, h in hosts.items()}}))
    return folder


def test_a_slow_hosts_ranks_are_named_together_and_an_equally_late_rank_elsewhere_is_not(tmp_path: Path) -> None:
    """Four hosts of two ranks; from #7 on, host b's CPU runs short: rank 3 arrives 150 ms late, rank 2 (served
    first) 30 ms; on host c rank 5 is also 30 ms late, alone. Under the 50 ms threshold on its own, rank 2 is
    named with its host's straggler (the rule FrOtelSlowHost holds live); rank 5 is not."""
    b = DumpBuilder(8)
    for i in range(30):
        b.collective(b.world, late_s={3: 0.15, 2: 0.03, 5: 0.03} if i >= 6 else {})
    hosts = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c", 6: "d", 7: "d"}
    for fmt in FORMATS:
        v = analyze(build_job(read_dumps(_on_hosts(b.write(tmp_path / fmt, fmt=fmt), hosts))))
        assert v.verdict == "straggler" and blamed(v) == [(2, "straggler"), (3, "straggler")], blamed(v)
        assert "its host b also holds straggler rank(s) 3" in v.culprits[0].evidence
    alone = analyze(build_job(read_dumps(b.write(tmp_path / "no-hosts"))))
    assert blamed(alone) == [(3, "straggler")]  # without hosts, 30 ms is on time


def test_a_host_whose_ranks_are_late_in_turn_is_named_by_its_arrival(tmp_path: Path) -> None:
    """Host b's CPU serves its two ranks in turn from #7 on (late together from #8, where the later is 90 ms): rank 2 45, 0, 90 ms late in turn, rank 3 0, 90, 45
    (each alone: median and mean 45 ms, under the 50 ms threshold). The host arrives 45-90 ms late every time:
    both named, as a slow host. Host c's rank 5 is 20 ms late on every collective: on time."""
    b = DumpBuilder(8)
    for i in range(30):
        late = {2: (0.045, 0.0, 0.09)[i % 3], 3: (0.0, 0.09, 0.045)[i % 3]} if i >= 6 else {}
        b.collective(b.world, late_s={**late, 5: 0.02})
    hosts = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c", 6: "d", 7: "d"}
    v = analyze(build_job(read_dumps(_on_hosts(b.write(tmp_path / "pickle"), hosts))))
    assert v.verdict == "straggler" and blamed(v) == [(2, "straggler"), (3, "straggler")], blamed(v)
    assert "the ranks of host b (2-3)" in v.culprits[0].evidence and "since #8" in v.culprits[0].evidence
    assert analyze(build_job(read_dumps(b.write(tmp_path / "no-hosts")))).verdict == "healthy"  # each alone: on time


def test_healthy_job_accuses_no_one(tmp_path: Path) -> None:
    """Everything completed, with pipeline traffic: healthy, nobody named."""
    b = DumpBuilder(4)
    pp = b.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1, 2, 3])
    for _ in range(8):
        b.collective(b.world, late_s={2: 0.001})
        pipeline_microbatches(b, pp, [0, 1, 2, 3], n=1)
    for v in verdicts(b, tmp_path, only_active=(False,)):
        assert v.verdict == "healthy" and v.culprits == []


def test_missing_dump_is_named_without_asserting_its_state(tmp_path: Path) -> None:
    """Rank 3's dump is absent: the others wait on it (missing_dump); it is never listed as 'not entered'."""
    b = DumpBuilder(4)
    warm_up(b)
    b.collective(b.world, ranks=[0, 1, 2], done=False)
    for v in verdicts(b, tmp_path, omit=(3,)):
        assert v.verdict == "hang" and blamed(v) == [(3, "missing_dump")]
        world = next(g for g in v.groups if g.group.name == "0")
        assert world.in_flight is not None
        assert world.in_flight.not_entered == () and world.in_flight.unknown == (3,)
        assert "not entered" not in render_verdict(v)


def test_a_silent_ranks_last_record_gives_its_kind_and_age_where_its_dump_is_missing(tmp_path: Path) -> None:
    """Rank 3 sent nothing, but its last record on its node (no entries, its counters: #3 enqueued and completed)
    stands in for its dump: not_enqueued from that record, with its age, instead of missing_dump."""
    b = DumpBuilder(4)
    warm_up(b)
    b.collective(b.world, ranks=[0, 1, 2], done=False)
    folder = b.write(tmp_path / "job", omit=(3,))
    taken = 1_750_000_000_000_000_000
    record = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0-3]"}},
              "pg_status": {"0": {"last_enqueued_collective": 3, "last_started_collective": -1,
                                  "last_completed_collective": 3}}, "entries": [],
              "fr_otel_last_record": {"taken_ns": taken, "pid": 7, "silent_since_ns": taken + 10**8,
                                      "loaded_ns": taken + 42 * 10**8}}
    (folder / "fr_trace_rank_3").write_bytes(pickle.dumps(record, protocol=4))
    v = analyze(build_job(read_dumps(folder)))
    assert v.verdict == "hang" and blamed(v) == [(3, "not_enqueued")]
    (culprit,) = v.culprits
    assert culprit.record is not None and culprit.record.age_s == pytest.approx(4.2)
    assert culprit.evidence.endswith("rank 3 never enqueued it (its last on this group is #3, by its last record, 4.2 s "
                                     "old (its agent's last word before it stopped answering))"), culprit.evidence
    assert culprit.to_dict()["record"] == {"taken_ns": taken, "age_s": pytest.approx(4.2),
                                           "silent_since_ns": taken + 10**8}


def test_a_silent_ranks_record_taken_inside_a_collective_its_peers_completed_never_blames_its_device(
        tmp_path: Path) -> None:
    """Rank 3's last record caught it inside #4 (enqueued, not completed), which its peers completed before waiting
    in #5: it went on past its record, so it is not_enqueued in #5, never not_completed in #4."""
    b = DumpBuilder(4)
    warm_up(b)
    b.collective(b.world, ranks=[0, 1, 2])
    b.collective(b.world, ranks=[0, 1, 2], done=False)
    folder = b.write(tmp_path / "job", omit=(3,))
    record = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0-3]"}},
              "pg_status": {"0": {"last_enqueued_collective": 4, "last_started_collective": -1,
                                  "last_completed_collective": 3}}, "entries": [],
              "fr_otel_last_record": {"taken_ns": 1_750_000_000_000_000_000}}
    (folder / "fr_trace_rank_3").write_bytes(pickle.dumps(record, protocol=4))
    v = analyze(build_job(read_dumps(folder)))
    assert blamed(v) == [(3, "not_enqueued")] and v.culprits[0].collective_seq_id == 5, render_verdict(v)


def test_most_dumps_missing_is_inconclusive_with_waiting_and_missing_ranks(tmp_path: Path) -> None:
    """Only 3 of 8 dumps: inconclusive; the waiting and the missing ranks are listed, no one is accused."""
    b = DumpBuilder(8)
    warm_up(b)
    b.collective(b.world, ranks=[0, 1, 2], done=False)
    for v in verdicts(b, tmp_path, omit=(3, 4, 5, 6, 7)):
        assert v.verdict == "inconclusive" and v.culprits == []
        assert v.incomplete is not None
        assert v.incomplete.waiting_ranks == (0, 1, 2) and v.incomplete.missing_ranks == (3, 4, 5, 6, 7)
        assert v.to_dict()["incomplete"]["dumps_present"] == 3
        text = render_verdict(v)
        assert "evidence incomplete" in text and "not entered" not in text


def test_gloo_shape_skip_is_read_like_a_real_gloo_dump(tmp_path: Path) -> None:
    """The builder's gloo shape (empty pg_config, retired as progress) gives the real job's verdict."""
    b = DumpBuilder(4, backend="gloo")
    warm_up(b, 5)
    b.collective(b.world, ranks=[0, 1, 3], done=False)
    for v in verdicts(b, tmp_path):
        assert "gloo" in v.backends
        assert blamed(v) == [(2, "not_enqueued")] and v.culprits[0].waiting_ranks == (0, 1, 3)


@pytest.mark.parametrize("fmt", FORMATS)
def test_json_output_carries_the_p2p_peer_and_op(tmp_path: Path, fmt: str) -> None:
    """The public JSON adds ``peer`` and ``op`` for point-to-point evidence (keys only added)."""
    folder = pure_pipeline_stall().write(tmp_path, fmt=fmt)
    out = analyze(build_job(read_dumps(folder))).to_dict()
    culprit = out["culprits"][0]
    assert culprit["rank"] == 2 and culprit["peer"] in (1, 3) and culprit["op"].startswith("nccl:")
    assert {"op", "peer"} <= set(culprit["related"][0])
    assert out["incomplete"] is None


def test_torchcomms_dumps_are_found_and_read(tmp_path: Path) -> None:
    """torchcomms writes ``torchcomm_fr_trace_<rank>`` JSON with ``ncclx:`` op names: analyze reads them."""
    b = DumpBuilder(4, backend="ncclx")
    pp = b.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1, 2, 3])
    warm_up(b)
    b.send(pp, 1, 2, done=False)
    folder = b.write(tmp_path / "tc", fmt="json", prefix="torchcomm_fr_trace_")
    v = analyze(build_job(read_dumps(folder)))
    assert v.ranks_loaded == 4 and v.backends == ("ncclx",) and v.problems == []
    assert blamed(v) == [(2, "not_enqueued")] and v.culprits[0].op == "ncclx:send 1->2"


def test_watch_finds_torchcomms_dumps_from_its_variable(tmp_path: Path) -> None:
    """``$TORCHCOMM_FR_DUMP_TEMP_FILE`` gives watch its folder and prefix when torch's own is unset."""
    from fr_otel.watch import dump_location

    env = {"TORCHCOMM_FR_DUMP_TEMP_FILE": str(tmp_path / "torchcomm_fr_trace_")}
    assert dump_location(None, None, env) == (tmp_path, "torchcomm_fr_trace_")
    env["TORCH_FR_DUMP_TEMP_FILE"] = "/nccl/comm_lib_trace_rank_"
    assert dump_location(None, None, env) == (Path("/nccl"), "comm_lib_trace_rank_")


def test_collective_stuck_in_a_pipeline_group_is_never_healthy(tmp_path: Path) -> None:
    """A collective all members entered and none completed, in a group that also carries send/recv:
    inconclusive with the reason, not healthy."""
    b = DumpBuilder(2)
    pp = b.group("1", "PIPELINE_MODEL_PARALLEL_GROUP", [0, 1])
    warm_up(b)
    b.transfer(pp, 0, 1)
    b.collective(pp, "broadcast", done=False)
    for v in verdicts(b, tmp_path, only_active=(False,)):
        assert v.verdict == "inconclusive" and v.culprits == []
