"""The agent in every rank under the launchers people train with: Lightning and HF Accelerate.

Real 4-rank CPU jobs of a tiny model (``support/lightning_job.py``), started as a user starts them. In each,
rank 2 stalls before its backward at step 3 (its peers wait in DDP's gradient all_reduce) until the test has
seen the incident, then the job runs to its end. Each job holds: an agent in 4 of 4 ranks (each rank's
``/metrics`` answers as that rank, one start-up line), the incident names rank 2 alone with every rank's
recorder in it (no healthy rank blamed, none missing for want of an agent), a spawning parent never warns
that it has no process group (the warning is due 30 s after an agent starts, long after the children are
spawned), and the job ends with status 0 and no traceback.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import urllib.request
from pathlib import Path

import pytest
from support.jobs import Job, installed_bin, job_env

from fr_otel.common.ports import free_port_block, unused_tcp_port
from fr_otel.testing.otlp import wait_for

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
]

SCRIPT = Path(importlib.util.find_spec("support.lightning_job").origin)  # type: ignore[union-attr,arg-type]
WORLD, STALL_RANK = 4, 2
INCIDENT = re.compile(r"incident 1 \(stall, raised by rank \d\): hang; culprits: rank (\d+) \(not_enqueued")
NO_GROUP = re.compile(r"no process group yet, .*?\(pid (\d+),")


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"needs {module} (pip install -e '.[launchers]' -c constraints.txt: scripts/setup.sh does)")


def _rank_of(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            body = resp.read().decode()
    except OSError:
        return None
    match = re.search(r'^fr_info\{.*?\brank="(\d+)"', body, flags=re.MULTILINE)
    return match.group(1) if match else None


def _run_stalled_job(tmp: Path, jobs: list[Job], cmd: list[str], *, fr_otel_run: bool, **extra: str) -> str:
    """Start the job (under `fr-otel run` or not), check every rank's agent while rank 2 stalls and the incident,
    release it, and return its output once it ended well."""
    base = free_port_block(WORLD)
    release = tmp / "release"
    env = job_env(tmp, FR_OTEL_METRICS_PORT=str(base), FR_OTEL_STALL_SECONDS="3", FR_OTEL_PG_WARN_SECONDS="30",
                  FR_OTEL_POLL_INTERVAL="0.25", JOB_MARKERS=str(tmp / "markers"), JOB_STALL_RANK=str(STALL_RANK),
                  JOB_STALL_SECONDS="60", JOB_RELEASE=str(release), MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(unused_tcp_port()), HF_HOME=str(tmp / "hf"), PYTHONWARNINGS="ignore", **extra)
    bin_dir = installed_bin(tmp / "bin")
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    if fr_otel_run:
        cmd = [str(bin_dir / "fr-otel"), "run", "--", *cmd]
    jobs.append(job := Job(cmd, env, tmp))
    try:
        urls = {r: f"http://127.0.0.1:{base + r}/metrics" for r in range(WORLD)}
        seen = wait_for(lambda: INCIDENT.search(job.output) is not None or job.proc.poll() is not None, timeout=120,
                        interval=0.2)
        assert seen and job.proc.poll() is None, job.output[-6000:]
        answers = {r: _rank_of(url) for r, url in urls.items()}  # rank 2 still stalls: every agent still serves
        assert answers == {r: str(r) for r in range(WORLD)}, (answers, job.output[-6000:])
    finally:
        release.touch()
    assert job.wait() == 0, job.output[-6000:]
    out = job.output
    assert INCIDENT.findall(out) == [str(STALL_RANK)], out[-6000:]  # rank 2 alone, once
    assert f"{WORLD} of {WORLD} ranks' recorders" in out and "sent no recorder" not in out, out[-6000:]
    assert re.findall(r"agent on \(rank (\d+) of (\d+)\)", out) == [("0", str(WORLD))], out[-6000:]
    ranks = {p.read_text() for p in (tmp / "markers").glob("pid_rank_*")}
    assert len(ranks) == WORLD and set(NO_GROUP.findall(out)) <= ranks, out[-6000:]  # no parent warns
    assert "Traceback" not in out and "BrokenPipeError" not in out, out[-6000:]
    return out


@pytest.mark.parametrize(("strategy", "how"), [("ddp", "run"), ("ddp", "start"), ("ddp_spawn", "run"),
                                               ("ddp_spawn", "start")])
def test_lightning_runs_an_agent_in_every_rank_and_names_the_stalled_one(
        tmp_path: Path, jobs: list[Job], strategy: str, how: str) -> None:
    """Lightning's ddp (rank 0 is the process the user started, the others its subprocesses) and ddp_spawn
    (torch.multiprocessing.spawn), under `fr-otel run -- python train.py` and with fr_otel.start() at the top of
    the script."""
    _needs("lightning")
    _run_stalled_job(tmp_path, jobs, [sys.executable, str(SCRIPT)], fr_otel_run=how == "run", JOB_STRATEGY=strategy,
                     JOB_AGENT="start" if how == "start" else "")


def test_accelerate_launch_runs_an_agent_in_every_rank_and_names_the_stalled_one(
        tmp_path: Path, jobs: list[Job]) -> None:
    """`fr-otel run -- accelerate launch --multi_gpu --num_processes 4` with Accelerator(cpu=True): the launcher
    (torchrun's, in process) runs none, each of its workers one."""
    _needs("accelerate")
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    assert accelerate is not None
    cmd = [accelerate, "launch", "--multi_gpu", "--num_processes", str(WORLD), "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(unused_tcp_port()),
           str(SCRIPT)]
    _run_stalled_job(tmp_path, jobs, cmd, fr_otel_run=True, JOB_FRAMEWORK="accelerate")
