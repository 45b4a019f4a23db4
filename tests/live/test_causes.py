"""Why the culprit stopped, live: real 4-rank gloo jobs whose rank 2 stops for one known reason each.

Each job runs ``support/cause_job.py`` under torchrun with the agent; at step 6 rank 2 spins in Python, waits on
a DataLoader whose worker never answers, deadlocks two threads, opens a FIFO no one writes, holds its GIL in a
catastrophic regex or a ``ctypes.PyDLL`` sleep, stops itself with SIGSTOP, is OOM-killed under its job's memory
cgroup, leaves the loop and exits normally, (on one node of a two-node job on this host) raises, waits on an Event
nobody sets, multiplies matrices in torch forever, waits on a queue whose producer thread died, waits on a child
process, calls barrier where its peers call all_reduce, or thrashes its page cache at its memory cgroup's limit.
The incident must name rank 2 with the right cause class and evidence lines: in the incident's summary
(``incident.json``), in the agent's log line, on the page and in ``fr-otel analyze --json`` of the incident's
folder; where rank 2 cannot send its part (its GIL held, stopped, OOM-killed), the incident still loads all 4
ranks, rank 2's kind read from its last record on its node, with that record's age; a healthy run raises nothing.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.jobs import Job, job_env
from support.memory_cgroup import MemoryLimit

from fr_otel.agent.observe.last_record import STALE_RECORD_POLLS
from fr_otel.common.ports import unused_tcp_port
from fr_otel.otlp.jsonl import read_jsonl
from fr_otel.testing.otlp import ReceivedSpan, wait_for

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
]

CAUSE_JOB = Path(importlib.util.find_spec("support.cause_job").origin)  # type: ignore[union-attr,arg-type]
CULPRIT = 2


#: The kinds whose rank 2 cannot send its part: their incident reads its last record on its node, so it stops late
#: enough (step 16, ~0.9 s in) for its agent to have polled more than once by then.
SILENT = ("gil_regex", "gil_pydll", "stopped", "oom")


def _env(tmp: Path, kind: str, **extra: str) -> dict[str, str]:
    step = {"CAUSE_STEP": "16", "CAUSE_STEPS": "20"} if kind in SILENT else {"CAUSE_STEP": "6"}
    return job_env(tmp, CAUSE_KIND=kind, CAUSE_RANK=str(CULPRIT), FR_OTEL_METRICS_PORT="off",
                   FR_OTEL_STALL_SECONDS="3", **step, **extra)


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args, str(CAUSE_JOB)]


def _incident(out: Path, job: Job | list[Job]) -> tuple[Path, dict[str, Any]]:
    """The incident's folder and its incident.json, once written."""
    wait_for(lambda: bool(list(out.glob("**/dumps/*/incident.json"))), timeout=90, interval=0.2)
    found = list(out.glob("**/dumps/*/incident.json"))
    outputs = "\n".join(j.output[-3000:] for j in (job if isinstance(job, list) else [job]))
    assert found, f"no incident within 90 s:\n{outputs}"
    path = sorted(found)[0]
    return path.parent, json.loads(path.read_text())


def _check(folder: Path, incident: dict[str, Any], want: str, log: str,
           run_cli: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rank 2 is the culprit with cause ``want`` and evidence lines, in incident.json, the log and analyze --json;
    returns its cause and that JSON."""
    culprits = {c["rank"]: c for c in incident["summary"]["culprits"]}
    assert CULPRIT in culprits, json.dumps(incident["summary"], indent=1)[:3000]
    cause = culprits[CULPRIT]["cause"]
    assert cause["class"] == want and cause["evidence"], json.dumps(cause, indent=1)
    assert f"cause: {want}" in log, log[-4000:]
    done = run_cli("analyze", "--json", str(folder))
    assert done.returncode in (0, 1, 2), done.stderr  # the exit status says the verdict; the JSON is what counts
    said = json.loads(done.stdout)
    offline = {c["rank"]: c for c in said["culprits"]}
    assert offline[CULPRIT]["cause"]["class"] == want, json.dumps(offline[CULPRIT], indent=1)[:3000]
    return cause, said


def _check_from_last_record(folder: Path, incident: dict[str, Any], offline: dict[str, Any], log: str) -> None:
    """Rank 2 sent nothing, yet all 4 ranks are loaded: its kind comes from its own last record on its node (not
    ``missing_dump``), with that record's age, live and in ``fr-otel analyze --json`` of the incident's folder
    (``offline``: :func:`_check`'s)."""
    live = incident["summary"]
    assert offline["ranks_loaded"] == 4 and not offline["missing_ranks"], offline["problems"]
    assert "4 of 4 ranks' recorders" in log, log[-3000:]
    for verdict in (live, offline):
        said = next(c for c in verdict["culprits"] if c["rank"] == CULPRIT)
        assert said["kind"] == "not_enqueued", said
        record = said["record"]
        # Its agent's last word on it is fresh by the reader's own rule (at most STALE_RECORD_POLLS polls before its
        # last heartbeat: a poll of a rank thrashing in reclaim before the OOM kill can take longer than one), and
        # came before the incident.
        fresh_ns = STALE_RECORD_POLLS * float(job_env(folder)["FR_OTEL_POLL_INTERVAL"]) * 1e9
        assert record["silent_since_ns"] - record["taken_ns"] <= fresh_ns and record["age_s"] > 0, record
        assert f"by its last record, {record['age_s']:.1f} s old" in said["evidence"], said
    assert live["culprits"][0]["record"] == offline["culprits"][0]["record"]
    assert (folder / f"fr_trace_rank_{CULPRIT}").is_file()


@pytest.mark.parametrize(("kind", "want"), [
    ("python_busy", "python_busy"), ("data_wait", "data_wait"), ("deadlock", "deadlock"), ("io_wait", "io_wait"),
    ("gil_regex", "gil_held"), ("gil_pydll", "gil_held"), ("stopped", "stopped"), ("exit", "exited"),
    ("sleeping", "sleeping"), ("native_busy", "native_busy"), ("thread_wait", "thread_wait"),
    ("child_wait", "child_wait"), ("divergence", "code_divergence"),
])
def test_each_cause_is_named_live_and_offline(kind: str, want: str, tmp_path: Path, jobs: list[Job],
                                              run_cli: Any) -> None:
    job = Job(_torchrun("--standalone", "--nproc-per-node", "4"), _env(tmp_path, kind), tmp_path)
    jobs.append(job)
    folder, incident = _incident(tmp_path / "out", job)
    wait_for(lambda: "cause: " in job.output, timeout=20, interval=0.2)
    cause, offline = _check(folder, incident, want, job.output, run_cli)
    assert f"<b>Cause</b> {cause['label']}" in (folder / "incident.html").read_text()  # the page says it too
    if kind in SILENT:
        _check_from_last_record(folder, incident, offline, job.output)
    proc = incident["ranks"][str(CULPRIT)]["proc"]
    if kind == "stopped":
        assert proc["state"] == "T"
    if kind.startswith("gil"):
        # Its own agent was silent: the cause rests on what a host-mate read, with its Python stack read from
        # outside by py-spy where the host permits it (the test extra installs py-spy; ptrace as root or
        # CAP_SYS_PTRACE): then the stack shows the very call.
        assert any("its own agent sent nothing" in e for e in cause["evidence"])
        if _py_spy_reads_a_process():
            where = "match (re/__init__.py" if kind == "gil_regex" else "_fault (support/cause_job.py:"
            assert proc.get("outside_stack") and any(
                e.startswith("Python stack read from outside (py-spy): ") and where in e for e in cause["evidence"]), cause
        else:
            assert not proc.get("outside_stack")
    if kind == "thread_wait":  # the producer's death, from the agent's threading.excepthook
        assert any(e.startswith("thread batch-producer died of ValueError: injected failure: a corrupt shard at ")
                   for e in cause["evidence"]), cause
    if kind == "child_wait":  # the child's pid, command and state
        assert any(e.startswith("child process ") and "(sleep 300): sleeping" in e for e in cause["evidence"]), cause
    if kind == "native_busy":
        assert any("torch.mm" in e for e in cause["evidence"]), cause
    if kind == "divergence":  # the culprit's call and its peers'
        assert any("barrier" in e and "all_reduce" in e for e in cause["evidence"]), cause
    if kind == "python_busy":  # the trace and the page say it too
        (trace,) = list((tmp_path / "out").glob("fr-otel-trace-*.jsonl"))
        spans = [ReceivedSpan(rs.resource, ss.scope, s) for request in read_jsonl(trace)
                 for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
        rank2 = [s for s in spans if s.attributes.get("pytorch.distributed.rank") == CULPRIT
                 and s.attributes.get("fr_otel.culprit")]
        assert rank2 and rank2[0].attributes["fr_otel.culprit.cause"] == "python_busy"
        root = next(s for s in spans if s.attributes.get("fr_otel.span") == "incident")
        assert root.attributes["fr_otel.culprit.causes"] == ["python_busy"]
        assert "python_busy" in (folder / "incident.html").read_text()


@functools.cache
def _py_spy_reads_a_process() -> bool:
    """Whether this host lets py-spy (installed beside this interpreter) read another process: ptrace permitted."""
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        return False
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        done = subprocess.run([str(exe), "dump", "--nonblocking", "--pid", str(child.pid)], capture_output=True,
                              timeout=20, check=False)
        return done.returncode == 0
    finally:
        child.kill()
        child.wait()


def _writable_memory_cgroup() -> str:
    try:
        MemoryLimit.create(f"fr-otel-probe-{os.getpid()}", 1 << 30).remove()
    except (RuntimeError, OSError) as exc:
        return str(exc)
    return ""


@pytest.mark.skipif(bool(_writable_memory_cgroup()), reason=f"needs a writable memory cgroup (root): "
                    f"{_writable_memory_cgroup()}")
def test_a_rank_killed_by_its_cgroups_oom_killer_is_named_oom_killed(tmp_path: Path, jobs: list[Job],
                                                                    run_cli: Any) -> None:
    """The whole job in one memory cgroup of 3 GiB (a pod's container); rank 2 allocates until the OOM killer kills it.
    Alone that takes a second; on a loaded box the cgroup can thrash in reclaim for more than 8 s first (seen in a
    clean-clone run: an incident read the rank alive, "gil_held"). The stall threshold is 30 s here, so the
    incident comes once it is dead: from torchrun's SIGTERM to its peers, or the stall."""
    limit = MemoryLimit.create(f"fr-otel-oom-{os.getpid()}-{tmp_path.name[-24:]}", 3 << 30)
    try:
        job = Job(limit.wrap(_torchrun("--standalone", "--nproc-per-node", "4")),
                  {**_env(tmp_path, "oom"), "FR_OTEL_STALL_SECONDS": "30"}, tmp_path)
        jobs.append(job)
        folder, incident = _incident(tmp_path / "out", job)
        wait_for(lambda: "cause: " in job.output, timeout=20, interval=0.2)
        assert limit.oom_kills() >= 1
        cause, offline = _check(folder, incident, "oom_killed", job.output, run_cli)
        _check_from_last_record(folder, incident, offline, job.output)
        # Gone, or a zombie its launcher has not reaped yet: dead either way.
        assert any("OOM kill" in e for e in cause["evidence"])
        assert incident["ranks"][str(CULPRIT)]["proc"]["state"] in ("gone", "Z")
    finally:
        job.kill()
        limit.remove()


@pytest.mark.skipif(bool(_writable_memory_cgroup()), reason=f"needs a writable memory cgroup (root): "
                    f"{_writable_memory_cgroup()}")
def test_a_rank_thrashing_at_its_memory_cgroups_limit_is_named_memory_pressure(tmp_path: Path, jobs: list[Job],
                                                                             run_cli: Any) -> None:
    """Rank 2 moves itself into a memory cgroup of 128 MiB and reads a 512 MiB file through mmap, over and over: its
    page cache is reclaimed as fast as it faults in (file pages can be dropped: it lives on). Its stack is in Python
    and its kernel wait is on a page: memory_pressure, from the cgroup's use against its limit and its hits."""
    limit = MemoryLimit.create(f"fr-otel-mem-{os.getpid()}-{tmp_path.name[-24:]}", 128 << 20)
    try:
        job = Job(_torchrun("--standalone", "--nproc-per-node", "4"),
                  _env(tmp_path, "memory_pressure", CAUSE_CGROUP=str(limit.path)), tmp_path)
        jobs.append(job)
        folder, incident = _incident(tmp_path / "out", job)
        wait_for(lambda: "cause: " in job.output, timeout=20, interval=0.2)
        cause, _ = _check(folder, incident, "memory_pressure", job.output, run_cli)
        assert cause["evidence"][0].startswith("its memory cgroup is at "), cause
        proc = incident["ranks"][str(CULPRIT)]["proc"]
        assert proc["memory_use"] >= 0.95 and proc["memory_limit_hits"] > 0 and proc["state"] in ("R", "D", "S"), proc
    finally:
        job.kill()
        limit.remove()


def test_an_exception_on_one_node_of_a_two_node_job_is_named_crashed_with_where(tmp_path: Path, jobs: list[Job],
                                                                                 run_cli: Any) -> None:
    """Two torchrun nodes of two ranks on this host; rank 2 (node 1) raises: crashed, with its exception and line,
    and (its exception raised the incident as the job ended) a failure verdict, never a hang."""
    port = unused_tcp_port()
    nodes = []
    for node in (0, 1):
        env = _env(tmp_path, "exception", FR_OTEL_OUT_DIR=str(tmp_path / "out" / f"node{node}"),
                   FR_OTEL_NODE_DIR=str(tmp_path / f"node{node}"))
        nodes.append(Job(_torchrun("--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                                   "--master-addr", "127.0.0.1", "--master-port", str(port)), env, tmp_path,
                         name=f"node{node}"))
    jobs.extend(nodes)
    folder, incident = _incident(tmp_path / "out", nodes)
    wait_for(lambda: any("cause: " in j.output for j in nodes), timeout=20, interval=0.2)
    log = "\n".join(j.output for j in nodes)
    line = next(i for i, text in enumerate(CAUSE_JOB.read_text().splitlines(), 1) if "injected failure" in text)
    cause, _ = _check(folder, incident, "crashed", log, run_cli)
    assert cause["evidence"][0] == (f"uncaught RuntimeError: injected failure: the batch had no labels at "
                                    f"{CAUSE_JOB}:{line} in _fault")
    assert incident["summary"]["verdict"] == "failure", incident["summary"]


def test_two_ranks_faulting_a_second_apart_are_both_named_the_first_first(tmp_path: Path, jobs: list[Job],
                                                                          run_cli: Any) -> None:
    """Rank 2 spins in Python at step 6; a second later rank 1, waiting in its all_reduce, stops itself with SIGSTOP.
    Both are culprits with their own causes, rank 2 (which stopped first) first; the other ranks stay waiters."""
    job = Job(_torchrun("--standalone", "--nproc-per-node", "4"), _env(tmp_path, "busy_then_stop", CAUSE_RANK2="1"),
              tmp_path)
    jobs.append(job)
    wait_for(lambda: (tmp_path / "markers" / "cause_rank_1").exists() or job.proc.poll() is not None, timeout=90,
             interval=0.1)
    folder, incident = _incident(tmp_path / "out", job)
    wait_for(lambda: "cause: " in job.output, timeout=20, interval=0.2)
    named = [(c["rank"], c["cause"]["class"]) for c in incident["summary"]["culprits"]]
    assert named[:2] == [(2, "python_busy"), (1, "stopped")] and len(named) == 2, named
    done = run_cli("analyze", "--json", str(folder))
    offline = [(c["rank"], c["cause"]["class"]) for c in json.loads(done.stdout)["culprits"]]
    assert offline == named, offline
    line = next(x for x in job.output.splitlines() if "culprits: rank 2" in x)  # the log line names both, in order
    assert line.index("cause: python_busy") < line.index("rank 1 (missing_dump") < line.index("cause: stopped"), line


def test_every_rank_raising_at_step_0_is_a_failure_verdict_naming_the_exception(tmp_path: Path, jobs: list[Job],
                                                                                run_cli: Any) -> None:
    """Every rank raises at step 0 and the job ends: a failure verdict naming each rank's exception, never healthy."""
    job = Job(_torchrun("--standalone", "--nproc-per-node", "4"), {**_env(tmp_path, "raise_all"), "CAUSE_STEP": "0"},
              tmp_path)
    jobs.append(job)
    assert job.wait() != 0
    folder, incident = _incident(tmp_path / "out", job)
    assert incident["summary"]["verdict"] == "failure", json.dumps(incident["summary"], indent=1)[:3000]
    culprits = incident["summary"]["culprits"]
    assert culprits and all(c["cause"]["class"] == "crashed" and "injected failure: rank" in c["cause"]["evidence"][0]
                            for c in culprits), culprits
    done = run_cli("analyze", "--json", str(folder))
    assert json.loads(done.stdout)["verdict"] == "failure", done.stdout[:3000]


def test_a_healthy_run_raises_no_incident(tmp_path: Path, jobs: list[Job]) -> None:
    job = Job(_torchrun("--standalone", "--nproc-per-node", "4"), _env(tmp_path, "", CAUSE_STEPS="40"), tmp_path)
    jobs.append(job)
    assert job.wait() == 0, job.output[-3000:]
    assert not list((tmp_path / "out").glob("**/incident.json")) and "raises incident" not in job.output
