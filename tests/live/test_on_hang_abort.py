"""FR_OTEL_ON_HANG=abort in a real 4-rank gloo job under torchrun: a rank stalled before its all_reduce (its
data loader) with a 300 s gloo timeout. The ranks stuck in the hang end with exit code 75 seconds after the
verdict, once the trace is delivered and the incident's files are written; torchrun's --max-restarts then
starts the job again, and the second attempt runs through. Without abort the same stall is only reported
(tests/live/test_agent.py: the job waits and finishes once the rank comes back)."""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import time
from pathlib import Path

import pytest
from support.jobs import TRAIN_LOOP, Job, job_env, wait_file

from fr_otel.agent.hang_abort import ABORT_EXIT_CODE
from fr_otel.testing.otlp import OtlpGrpcReceiver, ReceivedSpan, wait_for

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
]

STALL_S = 5.0
#: The acceptance bound: the stall threshold plus one incident's work (gather, verdict, export, files).
ENDED_WITHIN_S = STALL_S + 30.0


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its launcher has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _root(rx: OtlpGrpcReceiver) -> ReceivedSpan | None:
    return next((s for s in rx.spans() if s.span.name == "fr_otel.incident"), None)


def _abort_job(tmp_path: Path, rx: OtlpGrpcReceiver, *torchrun_flags: str) -> Job:
    """Rank 2 stalls 600 s before its step-6 all_reduce in the first attempt only; gloo's timeout is 300 s."""
    env = job_env(tmp_path, TRAIN_LOOP_STALL_RANK="2", TRAIN_LOOP_STALL_STEP="6", TRAIN_LOOP_STALL_SECONDS="600",
                  TRAIN_LOOP_STALL_ATTEMPT="0", TRAIN_LOOP_STEPS="12", TRAIN_LOOP_GLOO_TIMEOUT="300",
                  FR_OTEL_METRICS_PORT="off", FR_OTEL_GATHER_SECONDS="5", OTEL_EXPORTER_OTLP_ENDPOINT=rx.url)
    # fr-otel run's flag; it also gives each torchrun attempt its own store (pytorch#135712).
    cmd = [sys.executable, "-m", "fr_otel.cli", "run", "--on-hang", "abort", "--stall-seconds", str(STALL_S), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", *torchrun_flags,
           str(TRAIN_LOOP)]
    return Job(cmd, env, tmp_path)


def _first_rank_ended(job: Job, tmp_path: Path, rx: OtlpGrpcReceiver) -> tuple[float, dict[int, int]]:
    """Seconds from the stall to the first rank's exit (and the first attempt's pids), once the trace root, the
    incident's files and exclude-hosts.txt are checked to exist at that moment: all before the exit."""
    stall = json.loads(wait_file(tmp_path / "markers" / "stall_start.json", job, timeout=120).read_text())
    first = job.rank_pids()
    assert sorted(first) == [0, 1, 2, 3]
    assert wait_for(lambda: any(_gone(pid) for pid in first.values()), timeout=ENDED_WITHIN_S + 30, interval=0.05), \
        job.output[-6000:]
    ended = time.time()
    root = _root(rx)
    assert root is not None, job.output[-6000:]
    folder = tmp_path / "out" / "dumps" / root.span.trace_id.hex()
    assert (folder / "incident.json").is_file() and (folder / "incident.html").is_file()
    host = socket.gethostname()
    assert (folder / "exclude-hosts.txt").read_text() == f"{host}\n"
    assert root.attributes["fr_otel.exclude_hosts"] == [host] and root.attributes["fr_otel.culprit_ranks"] == [2]
    took = ended - stall["time"]
    assert took <= ENDED_WITHIN_S, f"ended {took:.1f} s after the stall began\n{job.output[-6000:]}"
    return took, first


def _ended_lines(out: str) -> list[str]:
    """The abort's log lines: ranks stuck in the hang only (never the culprit, which is in no collective)."""
    lines = [line for line in out.splitlines() if "ends its process with exit code 75" in line]
    assert lines and all("rank 2 " not in line for line in lines), out[-6000:]
    assert all("incident 1's verdict is a hang (culprit rank(s) 2)" in line for line in lines), lines
    return lines


def test_abort_ends_the_hung_job_with_exit_code_75_soon_after_the_verdict(tmp_path: Path, jobs: list[Job]) -> None:
    """No restarts: the job (fr-otel run around torchrun) exits 75 within the stall threshold + 30 s, not at the
    300 s gloo timeout; torchrun's own summary names the rank's exit code."""
    with OtlpGrpcReceiver() as rx:
        jobs.append(job := _abort_job(tmp_path, rx))
        took, _ = _first_rank_ended(job, tmp_path, rx)
        code = job.wait(60)
        exited = time.time()
    stall = json.loads((tmp_path / "markers" / "stall_start.json").read_text())
    assert code == ABORT_EXIT_CODE, job.output[-6000:]
    assert exited - stall["time"] <= ENDED_WITHIN_S + 30, job.output[-6000:]  # the culprit's own way out after
    out = job.output
    _ended_lines(out)
    assert f"exitcode: {ABORT_EXIT_CODE}" in out and "ended a hang (--on-hang abort): exit code 75" in out, out[-6000:]
    print(f"first rank ended {took:.1f} s and the job {exited - stall['time']:.1f} s after the stall began "
          f"(stall threshold {STALL_S:g} s, gloo timeout 300 s)")


def test_abort_then_torchrun_restarts_the_job_and_the_second_attempt_runs_through(
        tmp_path: Path, jobs: list[Job]) -> None:
    """torchrun --max-restarts 1: the ranks stuck in the hang end, torchrun starts the job again (new pids), and
    the second attempt, which stalls nowhere, completes: every rank's done marker, exit 0."""
    with OtlpGrpcReceiver() as rx:
        jobs.append(job := _abort_job(tmp_path, rx, "--max-restarts", "1"))
        took, first = _first_rank_ended(job, tmp_path, rx)
        assert job.wait(180) == 0, job.output[-6000:]
    second = job.rank_pids()
    assert sorted(second) == [0, 1, 2, 3] and not set(second.values()) & set(first.values())
    assert sorted(p.name for p in (tmp_path / "markers").glob("done_rank_*")) == [f"done_rank_{r}" for r in range(4)]
    _ended_lines(job.output)
    print(f"first rank ended {took:.1f} s after the stall began; the restarted job completed")


SBATCH = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "fr-otel.sbatch"


def test_the_shipped_sbatch_script_requeues_a_hung_job_without_the_host_its_verdict_names(
        tmp_path: Path, jobs: list[Job]) -> None:
    """deploy/slurm/fr-otel.sbatch with FR_OTEL_ON_HANG=abort, run by bash with a one-node srun/scontrol/sbatch:
    rank 1 stalls 600 s with a 300 s gloo timeout; the job ends with exit 75 about one incident later, and the
    script submits itself again leaving the node out (by its Slurm name), the count of resubmissions carried."""
    from fr_otel.common.ports import free_port_block, unused_tcp_port
    from support.slurm import NODE, allocation

    env = job_env(tmp_path, **allocation(tmp_path, job_id="4243"), GPUS_PER_NODE="2",
                  PROMETHEUS_TARGETS_DIR=str(tmp_path / "targets"), TRAIN_SCRIPT=str(TRAIN_LOOP),
                  RDZV_PORT=str(unused_tcp_port()), FR_OTEL_UPSTREAM_OTLP=f"127.0.0.1:{unused_tcp_port()}",
                  FR_OTEL_METRICS_PORT=str(free_port_block(2)), FR_OTEL_STALL_SECONDS=str(STALL_S),
                  FR_OTEL_GATHER_SECONDS="5", OTEL_EXPORTER_OTLP_TIMEOUT="2000", FR_OTEL_EXPORT_GRACE_S="0",
                  FR_OTEL_ON_HANG="abort",
                  TRAIN_LOOP_STALL_RANK="1", TRAIN_LOOP_STALL_STEP="3", TRAIN_LOOP_STALL_SECONDS="600",
                  TRAIN_LOOP_GLOO_TIMEOUT="300", TRAIN_LOOP_STEPS="10")
    del env["FR_OTEL_OUT_DIR"]  # the script's own: under the submit dir, per job
    jobs.append(job := Job(["bash", str(SBATCH)], env, tmp_path, "sbatch"))
    stall = json.loads(wait_file(tmp_path / "markers" / "stall_start.json", job, timeout=120).read_text())
    code = job.wait(ENDED_WITHIN_S + 60)
    took = time.time() - stall["time"]
    assert code == ABORT_EXIT_CODE, job.output[-6000:]
    submitted = [json.loads(line) for line in (tmp_path / "sbatch.jsonl").read_text().splitlines()]
    assert submitted == [[f"--exclude={NODE}", f"--export=ALL,FR_OTEL_RESUBMITS=1,FR_OTEL_EXCLUDED={NODE}",
                          str(SBATCH)]], job.output[-6000:]
    assert f"resubmitting it without {NODE}" in job.output
    lists = list((tmp_path / "fr-otel-out" / "4243").glob("dumps/*/exclude-hosts.txt"))
    assert lists and all(p.read_text() == f"{NODE}\n" for p in lists)
    print(f"the batch script ended {took:.1f} s after the stall began and resubmitted itself")


def test_abort_never_ends_a_straggling_job(tmp_path: Path, jobs: list[Job]) -> None:
    """Rank 1 takes 0.25 s more than its peers every step: the agent names it (a slow incident, the straggler
    verdict), and with abort on nothing ends: the job runs through and exits 0, no list of hosts to leave out."""
    env = job_env(tmp_path, TRAIN_LOOP_SLOW_RANK="1", TRAIN_LOOP_SLOW_SECONDS="0.25", TRAIN_LOOP_STEPS="150",
                  TRAIN_LOOP_GLOO_TIMEOUT="300", FR_OTEL_METRICS_PORT="off", FR_OTEL_GATHER_SECONDS="5")
    cmd = [sys.executable, "-m", "fr_otel.cli", "run", "--on-hang", "abort", "--stall-seconds", str(STALL_S), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", str(TRAIN_LOOP)]
    jobs.append(job := Job(cmd, env, tmp_path))
    assert job.wait(180) == 0, job.output[-6000:]
    incidents = [json.loads(p.read_text()) for p in (tmp_path / "out" / "dumps").glob("*/incident.json")]
    assert incidents, f"the straggler was never named\n{job.output[-6000:]}"
    for incident in incidents:
        summary = incident["summary"]
        assert summary["verdict"] == "straggler" and [c["rank"] for c in summary["culprits"]] == [1], summary
        assert summary["exclude_hosts"] == []
    assert "ends its process" not in job.output and not list((tmp_path / "out").glob("dumps/*/exclude-hosts.txt"))
    assert sorted(p.name for p in (tmp_path / "markers").glob("done_rank_*")) == [f"done_rank_{r}" for r in range(4)]
