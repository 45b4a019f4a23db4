"""Which culprit stopped first, on which node, at which training step: spec tests on
synthetic NCCL-shaped dumps (no torch)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fr_otel import analyze, build_job, read_dumps
from fr_otel.agent.guest.step_counter import StepCounter
from fr_otel.read.discovery import host_from_name
from fr_otel.read.steps import StepLog, step_log_from_raw
from fr_otel.report.text import render_verdict

S = 1_000_000_000
T0 = 1_760_000_000 * S  # 2025-10-09 08:53:20 UTC


def _entry(rid: int, pg: str, desc: str, seq: int, created: int, done: bool) -> dict:
    return {
        "record_id": rid, "pg_id": int(pg), "process_group": (pg, desc), "collective_seq_id": seq, "p2p_seq_id": 0,
        "op_id": seq, "profiling_name": "nccl:all_reduce", "is_p2p": False,
        "state": "completed" if done else "scheduled", "retired": done, "time_created_ns": created,
        "time_discovered_started_ns": created if done else None,
        "time_discovered_completed_ns": created + 1_000_000 if done else None, "duration_ms": 1.0 if done else None,
        "timeout_ms": 600_000, "input_sizes": [[1024]], "input_dtypes": ["Float"], "output_sizes": [[1024]],
        "output_dtypes": ["Float"], "thread_name": "main", "thread_id": "1", "frames": [],
    }


GROUPS = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("pair_A", (0, 1)), "2": ("pair_B", (2, 3))}


def write_job(folder: Path, *, stop: dict[int, float], skew: dict[int, float] | None = None,
              names: dict[int, str] | None = None, steps: bool = False) -> Path:
    """Four ranks: 5 healthy world all_reduces (1 s apart, a few ms of jitter), then per pair
    8 all_reduces; rank r in ``stop`` enqueues its pair's #8 at T0 + 10 s + stop[r] and nothing
    after, while its partner enqueues #9 and waits. ``skew`` shifts a rank's whole clock;
    ``steps`` gives each rank a step counter (one step per world all_reduce, then step 5)."""
    folder.mkdir(parents=True, exist_ok=True)
    skew = skew or {}
    for rank in range(4):
        off = int(skew.get(rank, 0) * S)
        jitter = rank * 2_000_000  # 0-6 ms: ordinary arrival differences
        entries = []
        for seq in range(1, 6):
            entries.append(_entry(len(entries), "0", "default_pg", seq, T0 + seq * S + jitter + off, True))
        pg = "1" if rank < 2 else "2"
        desc = GROUPS[pg][0]
        last = 8 if rank in stop else 9
        for seq in range(1, last + 1):
            created = T0 + 6 * S + seq * 100_000_000 + jitter + off
            if rank in stop and seq == 8:
                created = T0 + 10 * S + int(stop[rank] * S) + off
            entries.append(_entry(len(entries), pg, desc, seq, created, seq < 9))
        if rank not in stop:
            entries[-1]["time_created_ns"] = T0 + 11 * S + off
        dump = {
            "version": "2.10", "comm_lib_version": "2.21.5", "entries": entries,
            "pg_config": {n: {"name": n, "desc": d, "ranks": str(list(r))} for n, (d, r) in GROUPS.items()
                          if rank in r},
            "pg_status": {"0": {"last_enqueued_collective": 5, "last_started_collective": 5,
                                "last_completed_collective": 5},
                          pg: {"last_enqueued_collective": last, "last_started_collective": last,
                               "last_completed_collective": 8}},
        }
        if steps:
            starts = [[k, T0 + k * S + 500_000_000 + off] for k in range(0, 5)] + [[5, T0 + 5 * S + 500_000_000 + off]]
            dump["fr_otel_steps"] = {"step": 5, "source": "optimizer", "starts": starts}
        name = (names or {}).get(rank, f"nccl_trace_rank_{rank}")
        (folder / name).write_text(json.dumps(dump))
    return folder


def test_culprits_are_ordered_by_when_they_stopped_with_delays(tmp_path: Path) -> None:
    """Rank 3 stopped 0.41 s before rank 1: it comes first, rank 1 carries its delay, and the
    report says so in one line."""
    hosts = {0: "nccl_trace_rank_node01_0", 1: "nccl_trace_rank_node01_1", 2: "nccl_trace_rank_node02_2",
             3: "nccl_trace_rank_node02_3"}
    v = analyze(build_job(read_dumps(write_job(tmp_path, stop={1: 0.41, 3: 0.0}, names=hosts))))
    assert v.verdict == "hang"
    assert [c.rank for c in v.culprits] == [3, 1]
    assert v.stop_order is not None and v.stop_order.ordered and v.stop_order.first == 3
    first, second = v.culprits
    assert first.stopped_after_s == 0.0 and abs(second.stopped_after_s - 0.41) < 1e-6  # type: ignore[operator]
    assert second.stopped_ns - first.stopped_ns == 410_000_000  # type: ignore[operator]
    text = render_verdict(v)
    assert "rank 3 stopped first, 08:53:30.001 UTC; rank 1 0.410 s later" in text
    out = v.to_dict()
    assert out["stop_order"] == {"ranks": [3, 1], "ordered": True, "first": 3, "note": None, "same_point": False,
                                 "program_first": None, "points": []}
    assert [c["host"] for c in out["culprits"]] == ["node02", "node01"]
    assert out["nodes"] == []  # two hosts, one culprit each


def test_skewed_clocks_say_cannot_order_instead_of_a_wrong_order(tmp_path: Path) -> None:
    """Rank 3 truly stopped 0.5 s before rank 1, but its clock runs 2 s ahead: the healthy
    world collectives show the skew, so the verdict refuses to order them."""
    names = {r: f"nccl_trace_rank_node0{1 + r // 2}_{r}" for r in range(4)}
    v = analyze(build_job(read_dumps(write_job(tmp_path, stop={1: 0.5, 3: 0.0}, skew={2: 2.0, 3: 2.0}, names=names))))
    assert {c.rank for c in v.culprits} == {1, 3}
    assert v.stop_order is not None and not v.stop_order.ordered and v.stop_order.first is None
    assert "cannot be told" in (v.stop_order.note or "") and "node01" in (v.stop_order.note or "")
    assert all(c.stopped_after_s is None for c in v.culprits)
    assert "order of stopping unknown" in render_verdict(v)
    assert "rank 3 stopped first" not in render_verdict(v) and "rank 1 stopped first" not in render_verdict(v)


def test_one_host_one_clock_orders_even_close_stops(tmp_path: Path) -> None:
    """Culprits on one host share a clock: 1 ms apart still orders them."""
    names = {r: f"node07_nccl_trace_rank_{r}" for r in range(4)}
    v = analyze(build_job(read_dumps(write_job(tmp_path, stop={1: 0.001, 3: 0.0}, names=names))))
    assert v.stop_order is not None and v.stop_order.ordered and v.stop_order.ranks == (3, 1)


def test_host_is_parsed_from_dump_file_names() -> None:
    """The host in NCCL-style names is kept; names without one give none."""
    assert host_from_name("/dumps/nccl_trace_rank_node02_5") == "node02"
    assert host_from_name("node02_nccl_trace_rank_5.json") == "node02"
    assert host_from_name("comm_lib_trace_rank_gpu-a1.cluster_12.pkl") == "gpu-a1.cluster"
    for plain in ("_dump_9", "fr_trace_rank_3", "nccl_trace_rank_12", "trace_12", "rank 2 (live)"):
        assert host_from_name(plain) is None, plain


def test_culprits_sharing_a_host_are_reported_as_a_node(tmp_path: Path) -> None:
    """Ranks 1 and 3 both on node07: the verdict names the node once."""
    names = {0: "nccl_trace_rank_node01_0", 1: "nccl_trace_rank_node07_1", 2: "nccl_trace_rank_node02_2",
             3: "nccl_trace_rank_node07_3"}
    v = analyze(build_job(read_dumps(write_job(tmp_path, stop={1: 0.2, 3: 0.0}, names=names))))
    assert v.nodes == [("node07", (1, 3))]
    assert v.to_dict()["nodes"] == [{"host": "node07", "ranks": [1, 3]}]
    assert "node07: ranks 1,3 — look at the node" in render_verdict(v)
    assert "rank 3 (host node07): not_enqueued" in render_verdict(v)


def test_ranks_json_beside_the_dumps_names_hosts(tmp_path: Path) -> None:
    """Plain file names, a ranks.json beside them: hosts come from the map."""
    folder = write_job(tmp_path, stop={1: 0.2})
    (folder / "ranks.json").write_text(json.dumps({"version": 1, "ranks": {
        str(r): {"host": f"vm{r // 2}", "pid": 100 + r, "local_rank": r % 2} for r in range(4)}}))
    v = analyze(build_job(read_dumps(folder)))
    assert [(c.rank, c.host) for c in v.culprits] == [(1, "vm0")]
    assert "rank 1 stopped first, 08:53:30.201 UTC (the only culprit)" in render_verdict(v)
    assert v.problems == []


def test_collective_maps_to_its_step_and_the_culprit_is_still_in_it(tmp_path: Path) -> None:
    """Every rank counted steps: the in-flight all_reduce belongs to step 5, the culprit is
    in step 5, and the JSON and report say so."""
    v = analyze(build_job(read_dumps(write_job(tmp_path, stop={1: 0.2}, steps=True))))
    (c,) = v.culprits
    assert (c.rank, c.collective_seq_id, c.collective_step, c.step) == (1, 9, 5, 5)
    assert v.steps == {0: 5, 1: 5, 2: 5, 3: 5}
    out = v.to_dict()
    assert out["culprits"][0]["step"] == 5 and out["culprits"][0]["collective_step"] == 5
    assert out["steps"]["known"] is True
    stuck = next(g for g in out["groups"] if g["name"] == "1")
    assert stuck["in_flight"]["step"] == 5
    assert ("all_reduce #9 belongs to step 5; rank 1 is still in step 5; rank 0 waiting on it is in step 5"
            in render_verdict(v))


def test_steps_json_beside_the_dumps_gives_offline_analysis_the_step(tmp_path: Path) -> None:
    """The agent's step map, written beside plain dumps, gives `analyze` the same step; a bad
    map is one problem line; no map: the step is unknown, and the verdict says so."""
    folder = write_job(tmp_path / "plain", stop={1: 0.2})
    v = analyze(build_job(read_dumps(folder)))
    assert v.culprits[0].step is None and any("training step unknown" in n for n in v.notes)
    starts = [[k, T0 + k * S + 500_000_000] for k in range(6)]
    (folder / "steps.json").write_text(json.dumps({"version": 1, "ranks": {
        str(r): {"step": 5, "source": "optimizer", "starts": starts} for r in range(4)}}))
    v = analyze(build_job(read_dumps(folder)))
    assert (v.culprits[0].step, v.culprits[0].collective_step) == (5, 5)
    (folder / "steps.json").write_text("{not json")
    v = analyze(build_job(read_dumps(folder)))
    assert v.culprits[0].step is None
    assert [p for p in v.problems if "steps.json" in p] == [
        f"{folder / 'steps.json'}: invalid JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
        "(char 1)); training steps unknown"]


def test_step_counter_counts_one_optimizer_and_yields_to_explicit_steps() -> None:
    """The hook counts the first optimizer's steps only; fr_otel.step(n) takes over for good."""
    counter = StepCounter()
    assert counter.log() is None
    counter.arm()
    a, b = object(), object()
    for _ in range(3):
        counter.optimizer_stepped(a, (), {})
        counter.optimizer_stepped(b, (), {})
    log = counter.log()
    assert log is not None and (log.step, log.source) == (3, "optimizer")
    assert [s for s, _ in log.starts] == [0, 1, 2, 3]
    counter.set(100)
    counter.optimizer_stepped(a, (), {})
    log = counter.log()
    assert log is not None and (log.step, log.source) == (100, "fr_otel.step")
    assert log.step_at(log.starts[-1][1]) == 100 and log.step_at(log.starts[0][1] - 1) is None


def test_untrusted_step_logs_keep_only_sound_values() -> None:
    """Wrong types, unordered times and bools are dropped, not trusted."""
    assert step_log_from_raw({"step": "5", "starts": []}) is None
    assert step_log_from_raw({"step": True, "starts": []}) is None
    log = step_log_from_raw({"step": 3, "starts": [[1, 10], [2, 5], ["x", 20], [3, 30]], "source": 7})
    assert log == StepLog(3, ((1, 10), (3, 30)), "")


def test_trace_and_html_carry_step_host_and_first_to_stop(tmp_path: Path) -> None:
    """The root span names the step, the hosts and the first rank to stop; rank, entry and
    collective spans carry `pytorch.training.step`; the HTML card says it in words."""
    from fr_otel.report.html import render
    from fr_otel.trace import attributes as A
    from fr_otel.trace.spans import build_trace

    names = {r: f"nccl_trace_rank_node0{1 + r // 2}_{r}" for r in range(4)}
    job = build_job(read_dumps(write_job(tmp_path, stop={1: 0.3, 3: 0.0}, names=names, steps=True)))
    v = analyze(job)
    spans = build_trace(job, v).spans
    root = next(s for s in spans if s.name == "fr_otel.incident")
    assert root.attributes[A.TRAINING_STEP] == 5
    assert list(root.attributes[A.CULPRIT_HOSTS]) == ["node02", "node01"]
    assert root.attributes[A.FIRST_STOPPED] == 3
    rank1 = next(s for s in spans if s.name == "rank" and s.attributes[A.RANK] == 1)
    assert rank1.attributes[A.TRAINING_STEP] == 5 and rank1.resource.attributes["host.name"] == "node01"
    assert abs(rank1.attributes[A.STOPPED_AFTER_S] - 0.3) < 1e-6
    stuck = next(s for s in spans if s.attributes.get(A.SPAN_ROLE) == "collective"
                 and s.attributes[A.PG_NAME] == "1" and s.attributes[A.SEQ_ID] == 9)
    assert stuck.attributes[A.TRAINING_STEP] == 5
    early = next(s for s in spans if s.attributes.get(A.SPAN_ROLE) == "entry" and s.attributes[A.SEQ_ID] == 2
                 and s.attributes[A.PG_NAME] == "0")
    assert early.attributes[A.TRAINING_STEP] == 1  # enqueued at T0 + 2 s: step 1 began at T0 + 1.5 s
    html = render(job, v)
    assert "all_reduce #9 belongs to step 5; rank 1 is still in step 5" in html
    assert "<code>node01</code>" in html and "rank 3 stopped first" in html


def test_torch_optimizer_post_hook_counts_steps_with_no_code_change() -> None:
    """PyTorch's global optimizer hook feeds the counter: three SGD steps, step 3."""
    import pytest

    torch = pytest.importorskip("torch")
    counter = StepCounter()
    counter.arm()
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(counter.optimizer_stepped)
    try:
        w = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            w.sum().backward()
            opt.step()
    finally:
        handle.remove()
    log = counter.log()
    assert log is not None and log.step == 3 and [s for s, _ in log.starts] == [0, 1, 2, 3]


def test_watch_reads_the_step_map_and_hosts_beside_the_dumps(tmp_path: Path) -> None:
    """`fr-otel watch` picks up steps.json and ranks.json beside NCCL-named dumps: the
    exported root span names the step and the culprit's host."""
    from fr_otel.otlp.config import ExportConfig
    from fr_otel.otlp.jsonl import read_jsonl
    from fr_otel.trace.spans import TraceOptions
    from fr_otel.watch import DumpWatcher, WatchSettings

    folder = write_job(tmp_path / "dumps", stop={1: 0.2})
    starts = [[k, T0 + k * S + 500_000_000] for k in range(6)]
    (folder / "steps.json").write_text(json.dumps({"version": 1, "ranks": {
        str(r): {"step": 5, "source": "optimizer", "starts": starts} for r in range(4)}}))
    (folder / "ranks.json").write_text(json.dumps({"version": 1, "ranks": {
        str(r): {"host": f"vm{r}", "pid": 100 + r} for r in range(4)}}))
    now = [0.0]
    watcher = DumpWatcher(WatchSettings(folder, prefix="nccl_trace_rank_", settle_s=0.5, out_dir=str(tmp_path / "out")),
                          ExportConfig(), TraceOptions(job_id="job-A"), wall=lambda: T0 / S + 20 + now[0],
                          monotonic=lambda: now[0])
    incident = None
    for _ in range(5):
        incident = watcher.poll() or incident
        now[0] += 1.0
    assert incident is not None and incident.culprits == [1], incident
    spans = [s for request in read_jsonl(Path(incident.destination)) for rs in request.resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    root = next(s for s in spans if s.name == "fr_otel.incident")
    attrs = {a.key: a.value for a in root.attributes}
    assert attrs["pytorch.training.step"].int_value == 5
    assert [v.string_value for v in attrs["fr_otel.culprit_hosts"].array_value.values] == ["vm1"]


def _two_tp_groups(tmp_path: Path, *, tp2_extra: int = 0) -> tuple[Path, int]:
    """Eight ranks, two TENSOR_MODEL_PARALLEL_GROUPs; ranks 3 and 7 stop after TP #3 (+``tp2_extra``
    for rank 7's group) while their peers enter the next one; only in-flight entries are dumped,
    so the culprits leave no timestamps. Returns the folder and the peers' earliest next enqueue."""
    from fr_otel.testing.dump_builder import DumpBuilder

    job = DumpBuilder(world_size=8)
    tp1 = job.group("1", "TENSOR_MODEL_PARALLEL_GROUP", range(4))
    tp2 = job.group("2", "TENSOR_MODEL_PARALLEL_GROUP", range(4, 8))
    job.collective(job.world)
    for _ in range(3):
        job.collective(tp1)
        job.collective(tp2)
    for _ in range(tp2_extra):
        job.collective(tp2)
    job.collective(tp1, ranks=[0, 1, 2], done=False, late_s={1: 0.1, 2: 0.2})
    first_next = job.clock
    job.collective(tp2, ranks=[4, 5, 6], done=False, late_s={4: -0.001, 5: 0.3, 6: 0.3})  # 4 with rank 0
    return job.write(tmp_path, only_active=True), first_next


def test_undated_culprits_at_the_same_point_are_said_to_be_so_with_their_peers_bound(tmp_path: Path) -> None:
    """Ranks 3 and 7 left no timestamps and both stopped after TP #3: the verdict says they stopped
    at the same point, invents no order, and bounds both by their peers' first enqueue of #4."""
    from fr_otel.common.clock import format_clock

    folder, peers_next = _two_tp_groups(tmp_path)
    v = analyze(build_job(read_dumps(folder)))
    assert {c.rank for c in v.culprits} == {3, 7}
    so = v.stop_order
    assert so is not None and not so.ordered and so.first is None and so.program_first is None and so.same_point
    assert [(p.rank, p.last_enqueued) for p in so.points] == [(3, 3), (7, 3)]
    assert so.points[0].before_ns == peers_next  # rank 0 entered TP(1) #4 first; 1 and 2 later
    assert so.points[1].before_ns == peers_next
    bound = format_clock(peers_next)
    text = render_verdict(v)
    assert ("  ranks 3 and 7 stopped at the same point: last enqueued #3 on TENSOR_MODEL_PARALLEL_GROUP (1, 2)\n"
            "  which stopped first is unknown: no recorded activity dates their stops\n"
            f"  both stopped before {bound}, when their peers entered #4 (peers' clocks)\n") in text
    assert "stopped first," not in text
    out = v.to_dict()["stop_order"]
    assert out["same_point"] is True and out["first"] is None and out["program_first"] is None
    assert out["points"][0] == {"rank": 3, "process_group": {"name": "1", "desc": "TENSOR_MODEL_PARALLEL_GROUP"},
                                "last_enqueued": 3, "before_ns": peers_next}


def test_an_undated_culprit_that_got_less_far_stopped_first_in_program_order(tmp_path: Path) -> None:
    """Rank 3 stopped after TP #3, rank 7 after #5 of its own TP group (same kind of group, same
    program): rank 3 is first in program order; no time order is claimed."""
    folder, _ = _two_tp_groups(tmp_path, tp2_extra=2)
    v = analyze(build_job(read_dumps(folder)))
    so = v.stop_order
    assert so is not None and not so.ordered and so.first is None and not so.same_point
    assert so.program_first == 3
    text = render_verdict(v)
    assert ("  rank 3 stopped first in program order: its last enqueued is #3 on TENSOR_MODEL_PARALLEL_GROUP (1)\n"
            "  rank 7 got further: #5 on TENSOR_MODEL_PARALLEL_GROUP (2)\n"
            "  no recorded activity dates the stops\n") in text
    assert "rank 3 stopped before " in text and "when its peers entered #6 on TENSOR_MODEL_PARALLEL_GROUP (2)" in text
    assert v.to_dict()["stop_order"]["program_first"] == 3


def test_lock_gil_1st_ranks_9_and_14_stopped_at_the_same_point(nvrx: Path) -> None:
    """The real incident: ranks 9 and 14 left only pg_status; both stopped after TP #88683, before
    their peers entered #88684 at 22:47:17.550 UTC (rounded up; peers' clocks)."""
    from fr_otel.report.html import render
    from fr_otel.trace import attributes as A
    from fr_otel.trace.spans import build_trace

    job = build_job(read_dumps(nvrx / "lock_gil_1st"))
    v = analyze(job)
    lines = ["ranks 9 and 14 stopped at the same point: last enqueued #88683 on TENSOR_MODEL_PARALLEL_GROUP (37, 38)",
             "which stopped first is unknown: no recorded activity dates their stops",
             "both stopped before 22:47:17.550 UTC, when their peers entered #88684 (peers' clocks)"]
    sentence = "; ".join(lines)  # the trace's attribute: the lines in one string
    assert "".join(f"  {line}\n" for line in lines) in render_verdict(v)
    assert v.stop_order is not None and v.stop_order.first is None
    assert [p.before_ns for p in v.stop_order.points] == [1758581237549773782, 1758581237549794504]
    assert "ranks 9 and 14 stopped at the same point" in render(job, v)
    root = next(s for s in build_trace(job, v).spans if s.name == "fr_otel.incident")
    assert root.attributes[A.STOP_ORDER_NOTE] == sentence and A.FIRST_STOPPED not in root.attributes


def test_slurm_node_name_is_carried_beside_the_socket_host_and_groups_culprits(tmp_path: Path) -> None:
    """Under Slurm the agent records SLURMD_NODENAME as `node` and keeps gethostname() as `host`
    (the DCGM join); a ranks.json with nodes makes the verdict group culprits by node name."""
    import socket

    from fr_otel.agent.guest.process_identity import this_process
    from fr_otel.read.rank_map import host_map_json
    from fr_otel.read.rank_process import process_from_raw

    me = this_process(3, {"SLURMD_NODENAME": "gpu-017", "SLURM_LOCALID": "3"})
    assert (me.host, me.node, me.local_rank) == (socket.gethostname(), "gpu-017", 3)
    assert this_process(0, {}).node is None
    assert process_from_raw(me.as_json(), "ranks.json") == me.__class__(me.host, me.pid, 3, "ranks.json", "gpu-017")
    assert process_from_raw({"node": "x" * 300, "host": "h"}, "p") == me.__class__(host="h", source="p")

    folder = write_job(tmp_path, stop={1: 0.2, 3: 0.0})
    hosts = {0: ("ip-10-0-0-5", "gpu-016"), 1: ("ip-10-0-0-7", "gpu-017"), 2: ("ip-10-0-0-6", "gpu-016"),
             3: ("ip-10-0-0-7", "gpu-017")}
    from fr_otel.read.rank_process import RankProcess

    (folder / "ranks.json").write_text(json.dumps(host_map_json(
        {r: RankProcess(host=h, pid=100 + r, node=n) for r, (h, n) in hosts.items()})))
    v = analyze(build_job(read_dumps(folder)))
    assert v.nodes == [("gpu-017", (1, 3))]
    out = v.to_dict()
    assert [(c["host"], c["node"]) for c in out["culprits"]] == [("ip-10-0-0-7", "gpu-017")] * 2
    text = render_verdict(v)
    assert "gpu-017: ranks 1,3 — look at the node" in text
    assert "rank 3 (host ip-10-0-0-7, node gpu-017)" in text


def _watch_real_dumps(nvrx: Path, folder: Path, out: Path, names: dict[int, str]) -> list[int]:
    """The real lock_gil_1st dumps under ``names`` in ``folder``; one in-process watcher exports
    the incident to a file; returns the culprits."""
    from fr_otel.otlp.config import ExportConfig
    from fr_otel.trace.spans import TraceOptions
    from fr_otel.watch import DumpWatcher, WatchSettings

    folder.mkdir(parents=True, exist_ok=True)
    for r in range(16):
        (folder / names.get(r, f"nccl_trace_rank_{r}")).write_bytes((nvrx / "lock_gil_1st" / f"_dump_{r}").read_bytes())
    now = [0.0]
    settings = WatchSettings(folder, prefix=None, expected_ranks=frozenset(range(16)), settle_s=0.5,
                             out_dir=str(out))
    watcher = DumpWatcher(settings, ExportConfig(), TraceOptions(job_id="job-W"), wall=lambda: time.time() + now[0],
                          monotonic=lambda: now[0])
    incident = None
    for _ in range(5):
        incident = watcher.poll() or incident
        now[0] += 1.0
    assert incident is not None and incident.status == "file", incident
    return incident.culprits


def test_watch_writes_ranks_json_with_file_name_hosts_and_its_own_host_on_a_local_disk(
        nvrx: Path, tmp_path: Path) -> None:
    """Real dumps on a local disk: ranks named with a host get it, the others this watcher's host;
    the host the agent already wrote for rank 9 (with its pid) stays; `analyze` then names both."""
    import socket

    import pytest

    from fr_otel.watch.mounts import is_shared_filesystem

    if is_shared_filesystem(tmp_path) is not False:
        pytest.skip("the test folder is not on a local file system here")
    folder = tmp_path / "dumps"
    folder.mkdir()
    (folder / "ranks.json").write_text(json.dumps({"version": 1, "ranks": {"9": {"pid": 4242, "host": "agent-node"},
                                                                           "14": {"pid": 77}}}))
    names = {r: f"nccl_trace_rank_node00_{r}" for r in range(8)}
    assert _watch_real_dumps(nvrx, folder, tmp_path / "out", names) == [9, 14]
    ranks = json.loads((folder / "ranks.json").read_text())["ranks"]
    me = socket.gethostname()
    assert {r: ranks[str(r)] for r in (0, 7, 8, 9, 14, 15)} == {
        0: {"host": "node00"}, 7: {"host": "node00"}, 8: {"host": me}, 9: {"host": "agent-node", "pid": 4242},
        14: {"host": me, "pid": 77}, 15: {"host": me}}
    assert len(ranks) == 16 and not list(folder.glob(".ranks.json*"))
    v = analyze(build_job(read_dumps(folder)))
    assert [(c.rank, c.host) for c in v.culprits] == [(9, "agent-node"), (14, me)]


def test_watch_on_a_shared_file_system_vouches_only_for_hosts_in_file_names(
        nvrx: Path, tmp_path: Path, monkeypatch) -> None:
    """On NFS/Lustre the dumps may come from any node: plain-named ranks get no host (the
    watcher's own would be a guess), host-named ones do; with no host at all no file is written."""
    import fr_otel.watch.incident_export as watch

    monkeypatch.setattr(watch, "is_shared_filesystem", lambda path: True)
    names = {r: f"nccl_trace_rank_gpu-a{r % 2}_{r}" for r in (9, 14)}
    _watch_real_dumps(nvrx, tmp_path / "named", tmp_path / "out", names)
    ranks = json.loads((tmp_path / "named" / "ranks.json").read_text())["ranks"]
    assert ranks == {"9": {"host": "gpu-a1"}, "14": {"host": "gpu-a0"}}
    _watch_real_dumps(nvrx, tmp_path / "plain", tmp_path / "out2", {})
    assert not (tmp_path / "plain" / "ranks.json").exists()


def test_shared_file_systems_are_told_from_the_mount_table() -> None:
    """The longest mount point holding the folder decides: NFS, Lustre, fuse.* are shared, ext4
    and tmpfs local, a local disk mounted inside an NFS tree is local; no table, no answer."""
    from fr_otel.watch.mounts import is_shared_filesystem

    table = "\n".join([
        "/dev/vda / ext4 rw 0 0", "server:/export /shared nfs4 rw 0 0", "/dev/vdb /shared/scratch xfs rw 0 0",
        "lfs@o2ib:/fs /lustre lustre rw 0 0", "sshfs#h:/ /mnt/my\\040dir fuse.sshfs rw 0 0", "tmpfs /tmp tmpfs rw 0 0",
        "", "garbage",
    ])
    assert is_shared_filesystem("/shared/job/dumps", table) is True
    assert is_shared_filesystem("/shared/scratch/dumps", table) is False
    assert is_shared_filesystem("/sharedx/dumps", table) is False  # not under /shared
    assert is_shared_filesystem("/lustre/u/fr", table) is True
    assert is_shared_filesystem("/mnt/my dir/x", table) is True
    assert is_shared_filesystem("/tmp/x", table) is False
    assert is_shared_filesystem("/var/x", "server:/e /shared nfs rw 0 0") is None
