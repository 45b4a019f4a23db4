"""Incident context without a live job: where a rank runs, what it is doing now, one identity."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fr_otel.read.frame import Frame
from fr_otel.common.ids import trace_id_for
from fr_otel.incident.files import write_identity
from fr_otel.read.incident_file import IncidentIdentity
from fr_otel.read.rank_map import write_host_map
from fr_otel.agent.guest.stack_capture import capture_stacks, collective_of
from fr_otel.read.live_stack import LiveStacks, ThreadStack, stacks_from_raw
from fr_otel.otlp.jsonl import read_jsonl
from fr_otel.agent.guest.process_identity import this_process
from fr_otel.read.rank_process import RankProcess, process_from_raw
from fr_otel.testing.otlp import ReceivedSpan


def test_this_process_says_host_pid_and_local_rank() -> None:
    """The agent describes its own process: host name, pid, local rank."""
    me = this_process(3)
    assert (me.host, me.pid, me.local_rank, me.source) == (socket.gethostname(), os.getpid(), 3, "agent")
    assert me.label == f"host {me.host}, pid {me.pid}" and me.address == f"{me.host}:{me.pid}"


def test_the_node_name_is_slurms_else_the_one_kubernetes_passes_in() -> None:
    """A pod's host name is the pod's: FR_OTEL_NODE_NAME (the downward API's spec.nodeName) names the node;
    Slurm's SLURMD_NODENAME comes first; anything that is no host name is no node name."""
    assert this_process(0, {"FR_OTEL_NODE_NAME": "k8s-node-3"}).node == "k8s-node-3"
    assert this_process(0, {"FR_OTEL_NODE_NAME": "k8s-node-3", "SLURMD_NODENAME": "gpu017"}).node == "gpu017"
    assert this_process(0, {"FR_OTEL_NODE_NAME": "-lrole=gpu"}).node is None
    assert this_process(0, {}).node is None


def test_process_from_raw_round_trips_its_json_shape() -> None:
    """What the payload carries reads back as the same record."""
    where = RankProcess(host="node-7", pid=4242, local_rank=1, source="agent")
    assert process_from_raw(where.as_json(), "agent") == where


@pytest.mark.parametrize("raw", [
    None, "vm:42", [], {}, {"host": 7, "pid": "42"}, {"host": "", "pid": -1}, {"host": "x" * 300},
    {"host": "evil\nline"}, {"pid": True}, {"pid": 1 << 40},
])
def test_process_from_raw_drops_what_untrusted_dumps_get_wrong(raw: object) -> None:
    """Wrong types, empty or control-character hosts and absurd pids are dropped, never trusted."""
    assert process_from_raw(raw, "agent") is None


def test_process_from_raw_keeps_the_good_half() -> None:
    """A well-typed pid survives next to a bad host."""
    assert process_from_raw({"host": 7, "pid": 12}, "agent") == RankProcess(pid=12, source="agent")


# --------------------------------------------------------------------------- live stacks


def test_capture_stacks_puts_the_main_thread_first_and_skips_the_agents_threads() -> None:
    """Main thread first with its real file:line; threads named fr-otel-* (the agent) are left out."""
    stop = threading.Event()
    workers = [threading.Thread(target=stop.wait, name=n, daemon=True) for n in ("loader", "fr-otel-poller")]
    for w in workers:
        w.start()
    try:
        got: list[LiveStacks] = []
        walls: list[float] = []
        cpus: list[float] = []

        def flush() -> None:
            stop.wait(0.3)
            t0, cpu0 = time.perf_counter(), time.thread_time()
            got.append(capture_stacks())
            walls.append(time.perf_counter() - t0)
            cpus.append(time.thread_time() - cpu0)

        t = threading.Thread(target=flush, name="fr-otel-flush")
        t.start()
        t.join()
    finally:
        stop.set()
    now = got[0]
    names = [th.name for th in now.threads]
    assert names[0] == "MainThread" and "loader" in names
    assert not any(n.startswith("fr-otel-") for n in names)
    assert now.where is not None and now.where.filename == __file__  # this test, where join() was called
    assert now.doing == "t.join" and now.main is not None and now.main.frames[0].filename.endswith("threading.py")
    # capture_s is the capture's own measured cost. Cheap is held in this thread's CPU time, which a
    # loaded box does not inflate the way it does wall time (0.17 s wall once in CI; bench_agent: 0.16 ms)
    assert 0 < now.capture_s <= walls[0] and now.captured_ns > 0
    assert cpus[0] < 0.05, cpus


def test_capture_stacks_is_bounded() -> None:
    """Depth and thread count are capped, so a deep recursion or a thread pool cannot bloat a payload."""
    def deep(n: int) -> LiveStacks:
        return deep(n - 1) if n else capture_stacks(max_threads=1, max_frames=5)
    now = deep(50)
    assert len(now.threads) == 1 and len(now.threads[0].frames) == 5


def test_live_stack_says_what_the_main_thread_is_calling() -> None:
    """From the innermost user frame's source line: ``time.sleep`` at train.py:27, not the enclosing function."""
    now = LiveStacks(1, (ThreadStack("MainThread", 1, (Frame("train_step", "/job/train.py", 27),
                                                        Frame("main", "/job/train.py", 40)), "time.sleep(600)"),))
    assert now.doing == "time.sleep"
    assert now.describe() == "in time.sleep at /job/train.py:27 in train_step"
    assert stacks_from_raw(now.as_json()) == now


def test_live_stack_names_the_collective_the_main_thread_is_in() -> None:
    """A main thread inside torch.distributed's all_reduce is 'in all_reduce', at the user's call site."""
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    frames = (Frame("all_reduce", c10d, 2800), Frame("wrapper", "/venv/torch/distributed/c10d_logger.py", 81),
              Frame("train_step", "/job/train.py", 31))
    now = LiveStacks(1, (ThreadStack("MainThread", 1, frames, "work.wait()"),), collective_of(list(frames)))
    assert now.in_collective == "all_reduce"
    assert now.describe() == "in all_reduce at /job/train.py:31 in train_step"


SIGTERMED_JOB = """
import json, os, signal, sys, threading, time
from fr_otel.agent.guest.hooks import ExitHooks
from fr_otel.agent.guest.stack_capture import capture_stacks

def flush():  # what the agent does on SIGTERM: a moment later (the main thread is in the handler by then), capture
    time.sleep(0.5)
    main = capture_stacks().main
    print(json.dumps([[f.name, f.filename, f.line] for f in main.frames]), main.code, sep="\\n", flush=True)

def train_step():
    time.sleep(30)  # the user's code the rank sits in

hooks = ExitHooks(("sigterm",), lambda: None, lambda exc: None, flush)
hooks.install()
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
train_step()
"""


def test_a_stack_taken_while_the_main_thread_runs_the_agents_sigterm_handler_starts_in_the_users_code(
        tmp_path: Path) -> None:
    """SIGTERM to a rank in time.sleep: its main thread runs fr-otel's handler (waiting for the flush) when the
    stacks are taken; the stack leaves the agent's frames out and starts at the user's time.sleep."""
    script = tmp_path / "job.py"
    script.write_text(SIGTERMED_JOB)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -signal.SIGTERM, proc.stderr  # still dies of SIGTERM, after the flush
    frames_json, code = proc.stdout.splitlines()[:2]
    frames = json.loads(frames_json)
    assert frames[0][:2] == ["train_step", str(script)] and code == "time.sleep(30)  # the user's code the rank sits in"
    assert not any("/fr_otel/agent/" in filename for _, filename, _ in frames), frames
    assert LiveStacks(1, (ThreadStack("MainThread", 1, tuple(Frame(*f) for f in frames), code),)).describe() == (
        f"in time.sleep at {script}:{frames[0][2]} in train_step")


@pytest.mark.parametrize("raw", [None, [], {"threads": "x"}, {"threads": [{"frames": [{"line": "1"}]}]},
                                 {"threads": [{"frames": [{"filename": "a.py", "line": -4}]}]}])
def test_stacks_from_raw_refuses_what_untrusted_dumps_get_wrong(raw: object) -> None:
    """Ill-typed stacks read as nothing, never as a wrong frame."""
    assert stacks_from_raw(raw) is None


# --------------------------------------------------------------------------- one identity, offline


STALLED = LiveStacks(1_700_000_000_000_000_000, (
    ThreadStack("MainThread", 4242, (Frame("train_step", "/job/train.py", 27), Frame("main", "/job/train.py", 44)),
                "time.sleep(3600)"),
    ThreadStack("pin_memory", 4243, (Frame("_pin_memory_loop", "/venv/torch/utils/data/_utils/pin_memory.py", 51),)),
))


@pytest.fixture
def live_incident(nvrx: Path, tmp_path: Path) -> tuple[Path, IncidentIdentity]:
    """A copy of a real NCCL hang (culprits 9 and 14) with the incident.json a live agent would have left."""
    folder = tmp_path / "incident"
    shutil.copytree(nvrx / "lock_gil_1st", folder)
    identity = IncidentIdentity(
        job_id="torchelastic:run-7/restart-0", incident="3",
        trace_id=f"{trace_id_for('torchelastic:run-7/restart-0', '3'):032x}",
        root_attributes=(("fr_otel.incident.number", 3), ("fr_otel.incident.reason", "stall")),
        stacks={9: STALLED},
    )
    write_identity(folder, identity)
    write_host_map(folder, {r: RankProcess(host=f"node{r // 8}", pid=4000 + r, local_rank=r % 8, source="agent")
                            for r in range(16)}, 16)
    return folder, identity


def test_analyze_json_says_where_the_culprit_is_now(live_incident, run_cli) -> None:
    """analyze --json: each culprit gets a `now` key (host, pid, frames) and the live evidence sentence."""
    folder, identity = live_incident
    out = run_cli("analyze", str(folder), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["trace_id"] == identity.trace_id
    c9 = next(c for c in doc["culprits"] if c["rank"] == 9)
    assert c9["now"]["host"] == "node1" and c9["now"]["pid"] == 4009
    assert c9["now"]["frames"][0] == {"name": "train_step", "filename": "/job/train.py", "line": 27}
    assert c9["now"]["doing"] == "time.sleep" and c9["now"]["threads"][0]["name"] == "pin_memory"
    assert ("Now rank 9 (host node1, pid 4009) is in time.sleep at /job/train.py:27 in train_step, "
            "not in _reduce_scatter_base #88684.") in c9["evidence"]
    c14 = next(c for c in doc["culprits"] if c["rank"] == 14)
    assert c14["now"] == {"host": "node1", "pid": 4014, "local_rank": 6}  # no stack captured: where only


def test_export_of_the_folder_reuses_the_live_trace_id_and_is_idempotent(live_incident, run_cli,
                                                                          tmp_path: Path) -> None:
    """export picks up incident.json: same trace id as the live incident, same span ids twice, context on spans."""
    folder, identity = live_incident
    runs = []
    for i in range(2):
        out = run_cli("export", str(folder), "--out", str(tmp_path / f"out{i}"), "--json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["trace_id"] == identity.trace_id
        runs.append(_spans(Path(doc["export"]["path"])))
    ids = [sorted(s.span.span_id for s in run) for run in runs]
    assert ids[0] == ids[1] and len(ids[0]) == len(set(ids[0]))
    spans = runs[0]
    assert {s.span.trace_id.hex() for s in spans} == {identity.trace_id}
    root = next(s for s in spans if s.span.name == "fr_otel.incident")
    assert root.attributes["fr_otel.incident.number"] == 3
    assert root.attributes["host.name"] == "node1" and root.attributes["process.pid"] == 4009
    assert root.attributes["code.line.number"] == 27
    events = [_attrs(e) for e in root.span.events if e.name == "culprit"]
    assert "time.sleep at /job/train.py:27" in next(e for e in events if e["pytorch.distributed.rank"] == 9)["fr_otel.now"]
    rank9 = next(s for s in spans if s.span.name == "rank" and s.resource_attributes["pytorch.distributed.rank"] == 9)
    assert rank9.resource_attributes["host.name"] == "node1" and rank9.resource_attributes["process.pid"] == 4009
    assert rank9.attributes["fr_otel.stack.now"].startswith("/job/train.py:27 in train_step")
    assert [e.name for e in rank9.span.events] == ["stack.now"]


def _spans(path: Path) -> list[ReceivedSpan]:
    return [ReceivedSpan(rs.resource, ss.scope, span) for request in read_jsonl(path) for rs in request.resource_spans
            for ss in rs.scope_spans for span in ss.spans]


def _attrs(event: object) -> dict[str, object]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in event.attributes}  # type: ignore[attr-defined]


def test_report_shows_the_now_stack_and_a_runnable_next_step(live_incident, run_cli, tmp_path: Path) -> None:
    """report: the culprit card says where it runs and is now; the next step is ssh HOST py-spy dump --pid PID."""
    folder, identity = live_incident
    out = run_cli("report", str(folder), "-o", str(tmp_path / "r.html"))
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r.html").read_text()
    assert "<code>ssh node1 py-spy dump --pid 4009</code>" in page
    assert "<code>ssh node1 py-spy dump --pid 4014</code>" in page
    assert "host node1, pid 4009" in page and "time.sleep" in page
    assert 'class="now"' in page and "pin_memory" in page
    assert identity.trace_id in page


def test_a_broken_incident_file_costs_one_problem_line(nvrx: Path, tmp_path: Path, run_cli) -> None:
    """An unreadable incident.json is named in the problems; the verdict still comes from the dumps."""
    folder = tmp_path / "incident"
    shutil.copytree(nvrx / "lock_gil_1st", folder)
    (folder / "incident.json").write_text('{"format": "fr-otel/incident/1", "job_id": 7}')
    out = run_cli("analyze", str(folder), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["verdict"] == "hang" and "trace_id" not in doc
    assert any("incident.json: incident file without job_id" in p for p in doc["problems"])


# --------------------------------------------------------------------------- the HTML time axis


def test_time_axis_far_from_the_dump_reads_in_minutes_not_ten_digit_seconds() -> None:
    """A window 10 minutes before the dump: the first tick says −10 min 0 s, the dump is 0 (dump),
    no label like −600.00075 s."""
    from fr_otel.report.timeline import _Scale

    ref = 10**18
    lo = ref - 600 * 10**9 - 750_000
    ticks = [t for _, t in _Scale(lo, lo + 2_000_000, ref, "0 (dump)").ticks()]
    assert ticks[0] == "−10 min 0 s" and ticks[-1] == "0 (dump)"
    assert all(t.startswith("+") and ("ms" in t or "µs" in t) for t in ticks[1:-1]), ticks
    assert not any("600." in t for t in ticks)


def test_time_axis_over_minutes_counts_back_in_minutes() -> None:
    """A 10-minute window ending at the dump: ticks like −8 min 0 s … 0 (dump)."""
    from fr_otel.report.timeline import _Scale

    ref = 10**18
    ticks = [t for _, t in _Scale(ref - 600 * 10**9, ref, ref, "0 (dump)").ticks()]
    assert ticks[-1] == "0 (dump)" and "−2 min 0 s" in ticks and "−10 min 0 s" in ticks and all("min" in t for t in ticks[:-1]), ticks


def test_an_incident_file_older_than_its_dumps_is_not_used(nvrx: Path, tmp_path: Path, run_cli) -> None:
    """incident.json records the dump files it describes: once a newer incident overwrote them,
    it is named as stale and its trace id is not reused for dumps it never saw."""
    folder = tmp_path / "watched"
    shutil.copytree(nvrx / "lock_gil_1st", folder)
    files = {p.name: p.stat().st_size for p in folder.iterdir() if p.name.startswith("_dump_")}
    trace_id = f"{trace_id_for('job', 'watch-1'):032x}"
    write_identity(folder, IncidentIdentity("job", "watch-1", trace_id, files=files))
    assert json.loads(run_cli("analyze", str(folder), "--json").stdout)["trace_id"] == trace_id
    (folder / "_dump_3").write_bytes((nvrx / "lock_gil_2nd" / "_dump_3").read_bytes())  # the next incident
    doc = json.loads(run_cli("analyze", str(folder), "--json").stdout)
    assert "trace_id" not in doc
    assert any("incident.json: the dump files changed since it was written (_dump_3)" in p for p in doc["problems"])


def test_a_live_incidents_folder_reads_as_the_agent_saw_it_not_as_a_watchdogs_leftovers(live_incident) -> None:
    """Offline, the ranks.json beside a live incident's incident.json is what the agent knew at incident time:
    a culprit without live stacks (rank 14) is not called gone as after an NCCL watchdog abort."""
    from fr_otel import analyze_incident
    from fr_otel.report.advice import process_gone

    folder, _ = live_incident
    result = analyze_incident([str(folder)])
    c14 = next(c for c in result.verdict.culprits if c.rank == 14)
    assert c14.now is None and c14.process is not None and c14.process.host == "node1"
    assert process_gone(result.verdict, c14) is None
    (folder / "incident.json").unlink()  # the same dumps and map without the live incident: a watchdog's dumps
    again = analyze_incident([str(folder)])
    assert process_gone(again.verdict, next(c for c in again.verdict.culprits if c.rank == 14)) is not None
