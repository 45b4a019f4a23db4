"""A collective the backend retired because it failed counts as in flight, wherever the mark comes from."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from fr_otel import analyze, build_job, read_dumps
from fr_otel.common.ids import trace_id_for
from fr_otel.agent.observe.payload import decode_payload, encode_payload
from fr_otel.agent.observe.recorder import GroupInfo
from fr_otel.read.failed import FailedCollective
from fr_otel.read.rank_process import RankProcess
from fr_otel.testing.dump_builder import DumpBuilder


def _timed_out_job(folder: Path) -> None:
    """4 gloo ranks; ranks 2-3 (node1) vanish during all_reduce #6, which gloo retires on 0-1 after its timeout."""
    job = DumpBuilder(4, backend="gloo")
    for _ in range(5):
        job.collective(job.world)
    job.collective(job.world, ranks=[0, 1], done=True)  # what the recorder says after the timeout
    job.write(folder)
    for rank in (2, 3):
        next(folder.glob(f"*_{rank}*")).unlink()
    hosts = {str(r): {"host": f"node{r // 2}"} for r in range(4)}
    (folder / "ranks.json").write_text(json.dumps({"version": 1, "world_size": 4, "ranks": hosts}))


def test_without_the_marks_a_timed_out_collective_looks_completed(tmp_path: Path) -> None:
    """The recorder alone shows nothing in flight after gloo's timeout: no rank is waited on."""
    _timed_out_job(tmp_path)
    verdict = analyze(build_job(read_dumps(tmp_path)))
    assert not any(g.in_flight for g in verdict.groups)


def test_marks_in_incident_json_put_the_failed_collective_back_in_flight(tmp_path: Path) -> None:
    """incident.json's per-rank failed marks (what the live agent saw) make #6 in flight on ranks 0-1:
    they wait on ranks 2-3, whose host is node1."""
    _timed_out_job(tmp_path)
    mark = {"pg": "0", "seq": 6, "reason": "RuntimeError: Timed out waiting 20000ms for recv operation to complete"}
    (tmp_path / "incident.json").write_text(json.dumps({
        "format": "fr-otel/incident/1", "job_id": "j", "incident": "1", "trace_id": f"{trace_id_for('j', '1'):032x}",
        "ranks": {"0": {"failed": [mark]}, "1": {"failed": [mark]}}}))
    job = build_job(read_dumps(tmp_path))
    assert job.progress(0, "0").completed == 5 and job.dumps[0].failed[0].seq == 6
    verdict = analyze(job)
    (group,) = [g for g in verdict.groups if g.in_flight]
    assert group.in_flight.seq == 6 and group.in_flight.entered == (0, 1)
    assert {(c.rank, c.kind, c.host) for c in verdict.culprits} == {(2, "missing_dump", "node1"),
                                                                   (3, "missing_dump", "node1")}


def test_a_payload_carries_its_marks_to_the_coordinator() -> None:
    """encode_payload(failed=...) -> decode_payload: the columns, counters and tail all say not completed."""
    entries = [{"record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": i + 1,
                "p2p_seq_id": 0, "op_id": i + 1, "profiling_name": "gloo:all_reduce", "is_p2p": False,
                "state": "scheduled", "retired": True, "time_created_ns": 10**18 + i * 10**6,
                "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "timeout_ms": 20000,
                "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
                "thread_name": "", "thread_id": "1"} for i in range(6)]
    raw = pickle.dumps({"version": "2.10", "comm_lib_version": "", "pg_config": {}, "entries": entries,
                        "pg_status": {0: {"last_enqueued_collective": 6, "last_started_collective": -1,
                                          "last_completed_collective": 6}}})
    payload = encode_payload(raw, [GroupInfo("0", "default_pg", (0, 1, 2, 3), 0)], 64, 10**18, RankProcess(pid=1),
                             failed=(FailedCollective("0", 6, "timed out"),))
    dump = decode_payload(payload, 0, "rank 0", problems := [])
    assert dump is not None and not problems
    assert dump.failed == (FailedCollective("0", 6, "timed out"),)
    assert dump.pg_status[0].completed == 5
    assert list(dump.histories["0"].completed) == [1, 1, 1, 1, 1, 0]
    assert [e.completed for e in dump.tail if e.collective_seq_id == 6] == [False]
    assert [e.completed for e in dump.entries][-2:] == [True, False]
