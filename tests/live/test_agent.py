"""The live agent in real gloo training jobs under torchrun: metrics in a real Prometheus,
incidents as one trace at a real OTLP receiver, and training never disturbed."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.jobs import TRAIN_LOOP, Job, job_env, torchrun, wait_file

import fr_otel
from fr_otel.diagnosis.job import build_job
from fr_otel.otlp.jsonl import read_jsonl
from fr_otel.read.rank_process import RankProcess
from fr_otel.read.reader import ReadResult
from fr_otel.testing.otlp import OtlpGrpcReceiver, ReceivedSpan, wait_for
from fr_otel.common.ports import free_port_block, unused_tcp_port
from support.prometheus import PrometheusServer, find_prometheus

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
]

_job_env, _torchrun, _wait_file = job_env, torchrun, wait_file


def _incident_root(rx: OtlpGrpcReceiver) -> ReceivedSpan | None:
    return next((s for s in rx.spans() if s.span.name == "fr_otel.incident"), None)


def _check_one_trace(rx: OtlpGrpcReceiver, ranks: set[int]) -> tuple[str, dict]:
    """Every span once, one trace id, each rank's spans under its resource, every link resolves."""
    spans = rx.spans()
    ids = [s.span.span_id for s in spans]
    assert len(ids) == len(set(ids)), "a span arrived twice"
    assert len(rx.trace_ids()) == 1
    known = set(ids)
    dangling = [(s.span.name, link.span_id.hex()) for s in spans for link in s.span.links
                if link.span_id not in known]
    assert dangling == []
    seen = {s.resource_attributes.get("pytorch.distributed.rank") for s in spans if s.span.name == "rank"}
    assert seen == ranks
    # The agent knows each rank's process: its Resource says where it ran.
    for s in spans:
        if s.span.name == "rank":
            assert s.resource_attributes["host.name"] and s.resource_attributes["process.pid"] > 0
    root = _incident_root(rx)
    assert root is not None
    return rx.trace_ids().pop(), root.attributes


@pytest.mark.skipif(find_prometheus() is None, reason="needs Debian's prometheus binary")
def test_live_stall_metrics_culprit_query_and_one_trace(tmp_path: Path, jobs: list[Job], run_cli) -> None:
    """Rank 2 stalls before the all_reduce of training step 20: Prometheus sees the age rise on
    ranks 0, 1, 3 and every rank's fr_training_step at 20, the PromQL names rank 2,
    fr_incidents_total counts the incident with its trace id as exemplar, and one trace with
    spans of all four ranks and the verdict (step 20, rank 2's host, rank 2 first to stop)
    arrives while the job is still stuck; then the job recovers and ends normally, and an
    offline analysis and report of the dump folder say the same step and host."""
    from fr_otel.common.promql import culprit_query

    stall_s, ws = 25, 4
    base = free_port_block(ws)
    with OtlpGrpcReceiver() as rx, PrometheusServer([f"127.0.0.1:{base + r}" for r in range(ws)],
                                                    scrape_interval="1s") as prom:
        env = _job_env(tmp_path, TRAIN_LOOP_AGENT="early", TRAIN_LOOP_STALL_RANK="2", TRAIN_LOOP_STALL_STEP="20",
                       TRAIN_LOOP_STALL_SECONDS=str(stall_s), TRAIN_LOOP_STEPS="24", TRAIN_LOOP_GLOO_TIMEOUT="60",
                       FR_OTEL_METRICS_PORT=str(base), FR_OTEL_STALL_SECONDS="4",
                       OTEL_EXPORTER_OTLP_ENDPOINT=rx.url)
        job = Job(_torchrun(ws), env, tmp_path)
        jobs.append(job)
        prom.wait_for_targets(up=ws, timeout=90)
        t0 = json.loads(_wait_file(tmp_path / "markers" / "stall_start.json", job).read_text())["time"]

        age = 'fr_inflight_collective_age_seconds{pg_desc="default_pg"}'
        waiting = {"0", "1", "3"}
        first = prom.wait_for(f"{age} > 1", lambda r: {s.labels["rank"] for s in r} == waiting, timeout=30)
        time.sleep(2.5)
        later = {s.labels["rank"]: s.value for s in prom.query(age)}
        for s in first:
            assert later[s.labels["rank"]] > s.value + 1.0, (first, later)
        assert later["2"] == 0.0  # the culprit is not in a collective at all

        named = prom.wait_for(culprit_query(2), timeout=30)
        assert {s.labels["rank"] for s in named} == {"2"}
        steps = {s.labels["rank"]: s.value for s in prom.query("fr_training_step")}
        assert steps == {"0": 20.0, "1": 20.0, "2": 20.0, "3": 20.0}  # every optimizer step counted, none lost

        assert wait_for(lambda: _incident_root(rx) is not None, timeout=40, interval=0.1), job.output[-4000:]
        arrived = time.time()
        counted = prom.wait_for("fr_incidents_total", lambda r: len(r) == ws and all(s.value >= 1 for s in r),
                                timeout=30)
        assert len(counted) == ws

        trace_id, root = _check_one_trace(rx, {0, 1, 2, 3})
        assert arrived - t0 < stall_s  # while the job was still stuck, long before its 60 s timeout
        assert root["fr_otel.verdict"] == "hang" and root["fr_otel.culprit_ranks"] == [2]
        assert root["fr_otel.incident.reason"] == "stall"
        host = socket.gethostname()
        assert root["pytorch.training.step"] == 20 and root["fr_otel.culprit_hosts"] == [host]
        assert root["fr_otel.first_stopped_rank"] == 2
        exemplars = wait_for(lambda: any(e.labels.get("trace_id") == trace_id
                                         for e in prom.exemplars("fr_incidents_total", t0 - 60, time.time() + 5)),
                             timeout=15, interval=0.5)
        assert exemplars, "no exemplar with the incident's trace id"

        assert job.wait() == 0, job.output[-4000:]  # the stall ended; training finished normally
    assert f"culprits: rank 2 (not_enqueued, host {host}, step 20)" in job.output
    assert "(rank 2 stopped first, " in job.output
    dumps = tmp_path / "out" / "dumps" / trace_id
    # A sleep in the rank's own code: no host is left out (no exclude-hosts.txt).
    assert sorted(p.name for p in dumps.iterdir()) == [*(f"fr_trace_rank_{r}" for r in range(ws)),
                                                       "incident.html", "incident.json", "ranks.json", "steps.json"]
    assert pickle.loads((dumps / "fr_trace_rank_0").read_bytes())["version"]  # torch's own pickle, as is
    offline = run_cli("analyze", str(dumps), "--json")
    verdict = json.loads(offline.stdout)
    (culprit,) = verdict["culprits"]
    assert (culprit["rank"], culprit["step"], culprit["collective_step"], culprit["host"]) == (2, 20, 20, host)
    assert verdict["stop_order"]["first"] == 2 and verdict["steps"]["by_rank"] == {str(r): 20 for r in range(ws)}
    html = tmp_path / "report.html"
    assert run_cli("report", str(dumps), "-o", str(html)).returncode == 0
    text = html.read_text()
    assert "belongs to step 20; rank 2 is still in step 20; ranks 0-1,3 waiting on it are in step 20" in text
    assert f"<code>{host}</code>" in text and "first to stop" in text


def test_live_incident_says_where_the_culprit_is_now_everywhere(tmp_path: Path, jobs: list[Job], run_cli) -> None:
    """Rank 2 sleeps in time.sleep before its all_reduce: the log line, the trace (root and rank
    span), incident.json, incident.html and the JSON verdict all give its host, pid and the
    time.sleep frame at the right file:line; fr_otel.analyze_incident on the folder gives the
    CLI's JSON; exporting the dump folder afterwards gives the live trace id; the stuck
    all_reduce's entries are ERROR with code.*, and no completed span of rank 2 is stretched
    across the stall."""
    from fr_otel.read.dump import MAX_ESTIMATED_END_NS

    ws, host = 4, socket.gethostname()
    line = next(i for i, text in enumerate(TRAIN_LOOP.read_text().splitlines(), 1)
                if "time.sleep(stall_s)  # before the all_reduce" in text)
    frame = f"in time.sleep at {TRAIN_LOOP}:{line} in main"
    with OtlpGrpcReceiver() as rx:
        env = _job_env(tmp_path, TRAIN_LOOP_AGENT="early", TRAIN_LOOP_STALL_RANK="2", TRAIN_LOOP_STALL_STEP="8",
                       TRAIN_LOOP_STALL_SECONDS="20", TRAIN_LOOP_STEPS="12", TRAIN_LOOP_GLOO_TIMEOUT="60",
                       FR_OTEL_METRICS_PORT="off", FR_OTEL_STALL_SECONDS="4", OTEL_EXPORTER_OTLP_ENDPOINT=rx.url)
        job = Job(_torchrun(ws), env, tmp_path)
        jobs.append(job)
        assert wait_for(lambda: _incident_root(rx) is not None, timeout=90, interval=0.1), job.output[-4000:]
        trace_id, root = _check_one_trace(rx, set(range(ws)))
        spans = rx.spans()
        pid = int((tmp_path / "markers" / "pid_rank_2").read_text())
        # The trace: the root and rank 2's span say where it runs and where it is now.
        assert root["fr_otel.culprit_ranks"] == [2]
        assert (root["host.name"], root["process.pid"], root["code.line.number"]) == (host, pid, line)
        assert frame in root["fr_otel.now"]
        rank2 = next(s for s in spans if s.span.name == "rank" and s.attributes["pytorch.distributed.rank"] == 2)
        assert (rank2.resource_attributes["host.name"], rank2.resource_attributes["process.pid"]) == (host, pid)
        assert rank2.attributes["fr_otel.stack.now"].startswith(f"{TRAIN_LOOP}:{line} in main")
        assert [e.name for e in rank2.span.events] == ["stack.now"]
        # Honest spans: the stuck all_reduce is ERROR at once, with its call site; nothing of
        # rank 2 that completed lasts longer than the bound on an estimated end.
        stuck = [s for s in spans if s.attributes.get("fr_otel.stuck")]
        assert {s.attributes["pytorch.distributed.rank"] for s in stuck} == {0, 1, 3}
        for s in stuck:
            assert s.span.status.code == s.span.status.STATUS_CODE_ERROR and s.attributes["error.type"] == "hang"
            assert s.attributes["code.file.path"] == str(TRAIN_LOOP) and s.attributes["code.line.number"] > line
        done2 = [s for s in spans if s.attributes.get("pytorch.distributed.rank") == 2
                 and s.attributes.get("pytorch.distributed.completed")]
        assert done2 and max(s.span.end_time_unix_nano - s.span.start_time_unix_nano for s in done2) <= MAX_ESTIMATED_END_NS
        assert job.wait() == 0, job.output[-4000:]
    # The log line.
    (line_out,) = [t for t in job.output.splitlines() if "culprits: rank 2 (not_enqueued" in t]
    assert f") at {host}:{pid} {frame}" in line_out
    # incident.json and incident.html beside the dumps.
    dumps = tmp_path / "out" / "dumps" / trace_id
    incident = json.loads((dumps / "incident.json").read_text())
    assert incident["trace_id"] == trace_id and incident["incident"] == "1"
    # FR_OTEL_ON_HANG's default, report: the job is left to wait (it finished once rank 2 came back, above); no
    # rank ended itself. A sleep in its own code is the code to fix: no host is named to leave out.
    assert not (dumps / "exclude-hosts.txt").exists() and incident["summary"]["exclude_hosts"] == []
    assert incident["summary"]["action"] == "fix_code" and root["fr_otel.action"] == "fix_code"
    assert "fr_otel.exclude_hosts" not in root and "ends its process" not in job.output
    assert incident["summary"]["verdict"] == "hang" and incident["summary"]["culprits"][0]["rank"] == 2
    me = incident["ranks"]["2"]
    where = json.loads((dumps / "ranks.json").read_text())["ranks"]["2"]  # where each rank ran: ranks.json's
    assert (where["host"], where["pid"], where["local_rank"]) == (host, pid, 2) and "host" not in me
    assert me["now"]["threads"][0]["frames"][0] == {"name": "main", "filename": str(TRAIN_LOOP), "line": line}
    assert sorted(int(r) for r in incident["ranks"]) == list(range(ws))
    page = (dumps / "incident.html").read_text()
    assert f"ssh {host} py-spy dump --pid {pid}" in page and f"host {host}, pid {pid}" in page
    assert "time.sleep" in page and f"{TRAIN_LOOP.name}:{line}" in page and trace_id in page
    # The JSON verdict of the folder, and its export: the live incident's identity.
    out = run_cli("analyze", str(dumps), "--json")
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)
    assert verdict["trace_id"] == trace_id
    assert out.stdout == fr_otel.analyze_incident(dumps).to_json() + "\n"  # the library's answer is the CLI's
    now = verdict["culprits"][0]["now"]
    assert (now["host"], now["pid"], now["frames"][0]["line"], now["doing"]) == (host, pid, line, "time.sleep")
    assert f"Now rank 2 (host {host}, pid {pid}) is {frame}, not in all_reduce #" in verdict["culprits"][0]["evidence"]
    out = run_cli("export", str(dumps), "--out", str(tmp_path / "offline"), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["trace_id"] == trace_id


def test_zero_code_change_with_collector_down_and_a_failing_agent(tmp_path: Path, jobs: list[Job]) -> None:
    """`fr-otel run -- torchrun ... train_loop.py` (which never imports fr_otel): each rank
    serves /metrics and raises the incident; the collector is down, so the trace is spooled;
    the dump folder is unusable, so the agent fails there: counted and logged. Training
    finishes normally all the same."""
    base = free_port_block(2)
    not_a_dir = tmp_path / "dumps-is-a-file"
    not_a_dir.write_text("")
    env = _job_env(tmp_path, TRAIN_LOOP_STALL_RANK="1", TRAIN_LOOP_STALL_STEP="8", TRAIN_LOOP_STALL_SECONDS="10",
                   TRAIN_LOOP_STEPS="16", TRAIN_LOOP_GLOO_TIMEOUT="60", OTEL_EXPORTER_OTLP_TIMEOUT="2")
    cmd = [sys.executable, "-m", "fr_otel.cli", "run", "--stall-seconds", "2", "--metrics-port", str(base),
           "--dump-dir", str(not_a_dir), "--endpoint", f"http://127.0.0.1:{unused_tcp_port()}",
           "--gather-seconds", "5", "--", *_torchrun(2)]
    job = Job(cmd, env, tmp_path)
    jobs.append(job)

    def scrape() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{base}/metrics", timeout=1) as resp:
                return resp.read().decode()
        except OSError:
            return ""

    assert wait_for(lambda: 'fr_info{' in scrape() or job.proc.poll() is not None, timeout=90, interval=0.2)
    assert 'rank="0"' in scrape(), job.output[-4000:]
    assert job.wait() == 0, job.output[-4000:]
    out = job.output
    assert "raises incident 1" in out
    assert "agent error in writing the dump file (training is not affected)" in out
    assert "NOT delivered" in out and "fr-otel replay" in out
    assert "agent stopped:" in out and "incident exports failed" in out
    spools = list((tmp_path / "out").glob("fr-otel-spool-*.jsonl"))
    assert len(spools) == 1
    spans = [s for request in read_jsonl(spools[0]) for rs in request.resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    assert any(s.name == "fr_otel.incident" for s in spans) and len(spans) > 10


def test_sigterm_while_stuck_in_a_collective_flushes_first(tmp_path: Path, jobs: list[Job]) -> None:
    """SIGTERM reaches rank 0 while its main thread sits in a gloo all_reduce (so no Python
    handler can run): the agent still flushes, raises the incident, the trace names rank 1,
    and only then does rank 0 die of SIGTERM."""
    with OtlpGrpcReceiver() as rx:
        env = _job_env(tmp_path, TRAIN_LOOP_AGENT="early", TRAIN_LOOP_STALL_RANK="1", TRAIN_LOOP_STALL_STEP="5",
                       TRAIN_LOOP_STALL_SECONDS="90", TRAIN_LOOP_GLOO_TIMEOUT="120", FR_OTEL_METRICS_PORT="off",
                       FR_OTEL_STALL_SECONDS="100", OTEL_EXPORTER_OTLP_ENDPOINT=rx.url)
        job = Job(_torchrun(2), env, tmp_path)
        jobs.append(job)
        _wait_file(tmp_path / "markers" / "stall_start.json", job)
        pid0 = int((tmp_path / "markers" / "pid_rank_0").read_text())
        time.sleep(2.0)  # rank 0 is in the all_reduce by now
        os.kill(pid0, signal.SIGTERM)
        assert wait_for(lambda: _incident_root(rx) is not None, timeout=30, interval=0.1), job.output[-4000:]
        assert job.wait() != 0
        _, root = _check_one_trace(rx, {0, 1})
    assert root["fr_otel.incident.reason"] == "SIGTERM while a collective was in flight"
    assert root["fr_otel.incident.raised_by"] == 0
    assert root["fr_otel.culprit_ranks"] == [1]
    assert "exitcode  : -15" in job.output  # torchrun's report: rank 0 died of SIGTERM, as without the agent


def test_uncaught_exception_raises_the_incident_its_peers_join(tmp_path: Path, jobs: list[Job]) -> None:
    """Rank 1 dies of an uncaught exception: its excepthook (after the traceback) raises the
    incident, rank 0 (waiting in the all_reduce) joins, one trace names rank 1; the peer's
    own failure that follows is not a second incident. The job ended by its own code: a failure
    verdict naming rank 1's exception and line, never a hang."""
    with OtlpGrpcReceiver() as rx:
        env = _job_env(tmp_path, TRAIN_LOOP_AGENT="late", TRAIN_LOOP_RAISE_RANK="1", TRAIN_LOOP_RAISE_STEP="5",
                       TRAIN_LOOP_GLOO_TIMEOUT="120", FR_OTEL_METRICS_PORT="off", FR_OTEL_STALL_SECONDS="100",
                       OTEL_EXPORTER_OTLP_ENDPOINT=rx.url)
        job = Job(_torchrun(2), env, tmp_path)
        jobs.append(job)
        assert job.wait() != 0
        assert wait_for(lambda: _incident_root(rx) is not None, timeout=5), job.output[-4000:]
        _, root = _check_one_trace(rx, {0, 1})
        culprit = next(s for s in rx.spans() if s.span.name == "rank" and s.attributes.get("fr_otel.culprit"))
    out = job.output
    assert out.index("RuntimeError: injected failure at step 5") < out.index("raises incident 1")
    assert root["fr_otel.verdict"] == "failure" and root["fr_otel.culprit.causes"] == ["crashed"]
    assert culprit.attributes["pytorch.distributed.rank"] == 1 and culprit.attributes["fr_otel.culprit.cause.domain"] == \
        "software"
    assert culprit.attributes["fr_otel.culprit.cause.evidence"][0].startswith(
        f"uncaught RuntimeError: injected failure at step 5 at {TRAIN_LOOP}:"), culprit.attributes
    assert root["fr_otel.incident.reason"] == "uncaught RuntimeError: injected failure at step 5"
    assert root["fr_otel.incident.raised_by"] == 1 and root["fr_otel.culprit_ranks"] == [1]
    assert "raises incident 2" not in out


def test_agent_says_how_many_spans_the_collector_rejected(tmp_path: Path, jobs: list[Job]) -> None:
    """A collector answering partial success (half the spans rejected): the coordinator's line says
    how many were rejected and that the trace was only partly delivered; a dump folder it cannot
    create is named as such instead of "dumps in DIR"."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the dump folder should go")
    with OtlpGrpcReceiver(reject_fraction=0.5) as rx:
        env = _job_env(tmp_path, TRAIN_LOOP_AGENT="late", TRAIN_LOOP_RAISE_RANK="1", TRAIN_LOOP_RAISE_STEP="5",
                       TRAIN_LOOP_GLOO_TIMEOUT="120", FR_OTEL_METRICS_PORT="off", FR_OTEL_STALL_SECONDS="100",
                       OTEL_EXPORTER_OTLP_ENDPOINT=rx.url, FR_OTEL_DUMP_DIR=str(blocker / "dumps"))
        job = Job(_torchrun(2), env, tmp_path)
        jobs.append(job)
        assert job.wait() != 0
        assert wait_for(lambda: rx.rejected_spans > 0, timeout=5), job.output[-4000:]
        rejected, kept = rx.rejected_spans, rx.span_count()
    out = job.output
    line = next((ln for ln in out.splitlines() if "raised by rank 1" in ln), "")
    assert f"only PARTLY delivered to {rx.url}: the collector rejected {rejected} of {rejected + kept} spans" in line
    assert f"no dump files: {blocker / 'dumps'}" in line and "dumps in" not in line, out[-4000:]


def test_payload_keeps_what_the_verdict_needs_with_true_membership(scenario_dumps) -> None:
    """What a rank sends its coordinator: in-flight entries and the last few per group, with
    pg_config replaced by the real groups (gloo's own is empty)."""
    from fr_otel.agent.observe.payload import decode_payload, encode_payload
    from fr_otel.agent.observe.recorder import GroupInfo

    raw = (scenario_dumps("subgroup_stall") / "pickle" / "rank_2").read_bytes()  # waits in B's all_reduce
    original = pickle.loads(raw)
    assert original["pg_config"] == {"": {"name": "", "desc": "", "ranks": "[]"}}  # the quirk
    groups = [GroupInfo("0", "default_pg", (0, 1, 2, 3), 0), GroupInfo("2", "subgroup_B", (2, 3), 1)]
    problems: list[str] = []
    where = RankProcess(host="node-7", pid=4242, local_rank=2, source="agent")
    dump = decode_payload(encode_payload(raw, groups, keep=1, dumped_at_ns=123, process=where), 2, "rank 2", problems)
    assert dump is not None and problems == []
    assert dump.process == where  # where the rank runs travels with its payload
    assert build_job(ReadResult(dumps={2: dump})).processes == {2: where}
    assert {n: c.ranks for n, c in dump.pg_config.items()} == {"0": (0, 1, 2, 3), "2": (2, 3)}
    assert dump.file_mtime_ns == 123
    per_group: dict[str, list[int]] = {}
    for e in dump.entries:
        per_group.setdefault(e.pg_name, []).append(e.collective_seq_id)
    pending = [e for e in dump.entries if not e.completed]
    assert len(dump.entries) < len(original["entries"])
    assert all(len(seqs) <= 1 + sum(1 for e in pending if e.pg_name == g) for g, seqs in per_group.items())
    assert pending, "the collective in flight must survive trimming"
