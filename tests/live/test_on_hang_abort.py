"""FR_OTEL_ON_HANG=abort in a real 4-rank gloo job under torchrun, with a 300 s gloo timeout: the ranks stuck in
the hang end seconds after the verdict, once the trace is delivered and the incident's files are written, with the
exit code that tells the scheduler what to do. A rank stalled in its own DataLoader is a fault of the job's code:
exit 70, no host left out, no drain advised, and the shipped sbatch script does not resubmit it. A rank stopped by a
signal (SIGSTOP) leaves no evidence whose fault it is: exit 75, and the script resubmits the job without leaving
any host out. torchrun's --max-restarts restarts either (it cannot tell them apart), and the second attempt runs
through. Without abort the same stall is only reported (tests/live/test_agent.py: the job waits and finishes once
the rank comes back)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from support.jobs import TRAIN_LOOP, Job, job_env, wait_file

from fr_otel.agent.hang_abort import ABORT_EXIT_CODE, CODE_FAULT_EXIT_CODE
from fr_otel.testing.otlp import OtlpGrpcReceiver, ReceivedSpan, wait_for

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
]

STALL_S = 5.0
#: The acceptance bound: the stall threshold plus one incident's work (gather, verdict, export, files) and the
#: ranks' way out.
ENDED_WITHIN_S = STALL_S + 40.0
#: What only evidence against a host may print: the scheduler commands that leave one out.
DRAIN_WORDS = ("sbatch --exclude", "--exclude=", "DRAIN", "cordon", "leave out next time", "Leave out next time")


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its launcher has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _root(rx: OtlpGrpcReceiver) -> ReceivedSpan | None:
    return next((s for s in rx.spans() if s.span.name == "fr_otel.incident"), None)


def _abort_job(tmp_path: Path, rx: OtlpGrpcReceiver, *torchrun_flags: str, **settings: str) -> Job:
    """Rank 2's DataLoader blocks 600 s reading its step-6 batch, in the first attempt only; gloo's timeout is
    300 s."""
    env = job_env(tmp_path, TRAIN_LOOP_STALL_RANK="2", TRAIN_LOOP_STALL_STEP="6", TRAIN_LOOP_STALL_SECONDS="600",
                  TRAIN_LOOP_STALL_IN="loader", TRAIN_LOOP_STALL_ATTEMPT="0", TRAIN_LOOP_STEPS="12",
                  TRAIN_LOOP_GLOO_TIMEOUT="300", FR_OTEL_METRICS_PORT="off", FR_OTEL_GATHER_SECONDS="5",
                  OTEL_EXPORTER_OTLP_ENDPOINT=rx.url, **settings)
    # fr-otel run's flag; it also gives each torchrun attempt its own store (pytorch#135712).
    cmd = [sys.executable, "-m", "fr_otel.cli", "run", "--on-hang", "abort", "--stall-seconds", str(STALL_S), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", *torchrun_flags,
           str(TRAIN_LOOP)]
    return Job(cmd, env, tmp_path)


def _first_rank_ended(job: Job, tmp_path: Path, rx: OtlpGrpcReceiver) -> tuple[float, dict[int, int], Path]:
    """Seconds from the stall to the first rank's exit (the first attempt's pids, the incident's folder), once the
    trace root and the incident's files are checked to exist at that moment: all before the exit. A code fault:
    the root says fix_code, and no exclude-hosts.txt is written."""
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
    assert not (folder / "exclude-hosts.txt").exists()
    assert root.attributes["fr_otel.culprit_ranks"] == [2] and root.attributes["fr_otel.action"] == "fix_code"
    assert "fr_otel.exclude_hosts" not in root.attributes and root.attributes["fr_otel.culprit.domains"] == ["software"]
    took = ended - stall["time"]
    assert took <= ENDED_WITHIN_S, f"ended {took:.1f} s after the stall began\n{job.output[-6000:]}"
    return took, first, folder


def _ended_lines(out: str, code: int = CODE_FAULT_EXIT_CODE) -> list[str]:
    """The abort's log lines: ranks stuck in the hang only (never the culprit, which is in no collective)."""
    lines = [line for line in out.splitlines() if f"ends its process with exit code {code}" in line]
    assert lines and all("rank 2 " not in line for line in lines), out[-6000:]
    assert all("incident 1's verdict is a hang (culprit rank(s) 2)" in line for line in lines), lines
    return lines


def test_abort_ends_a_data_loader_stall_with_exit_70_and_never_leaves_its_healthy_host_out(
        tmp_path: Path, jobs: list[Job]) -> None:
    """No restarts: rank 2 blocks in its DataLoader; the job (fr-otel run around torchrun) ends within the stall
    threshold + 40 s, not at the 300 s gloo timeout, with 70 (EX_SOFTWARE: a retry would hang again), not 75;
    rank 2's cause is data_wait in the software domain in incident.json, `analyze --json` and the page; no
    exclude-hosts.txt, `exclude_hosts` empty everywhere, and no --exclude, DRAIN or cordon in the log, the
    terminal or the page. Before the stall is an incident, anyone who reaches the store plants ``i/1..12/result =
    "{}"``: unsigned, it would read as incident 1 concluded and nobody would join; the job's secret (fr-otel run
    makes one) makes it nothing."""
    from support.store_forger import plant_in_job

    with OtlpGrpcReceiver() as rx:
        jobs.append(job := _abort_job(tmp_path, rx, FR_OTEL_LOG_LEVEL="debug"))  # the store's address is in its log
        wait_file(tmp_path / "markers" / "stall_start.json", job, timeout=120)
        plant_in_job(job.output, {f"i/{k}/result": "{}" for k in range(1, 13)})
        took, _, folder = _first_rank_ended(job, tmp_path, rx)
        code = job.wait(60)
        exited = time.time()
    stall = json.loads((tmp_path / "markers" / "stall_start.json").read_text())
    assert code == CODE_FAULT_EXIT_CODE, job.output[-6000:]
    assert exited - stall["time"] <= ENDED_WITHIN_S, job.output[-6000:]
    out = job.output
    _ended_lines(out)
    assert "i/<n>/result record without this job's signature" in out, out[-6000:]  # the planted results, seen
    assert f"exitcode: {CODE_FAULT_EXIT_CODE}" in out and "(--on-hang abort): exit code 70, do not resubmit" in out
    assert "what to do: fix the code" in out, out[-6000:]
    summary = json.loads((folder / "incident.json").read_text())["summary"]
    (culprit,) = summary["culprits"]
    assert culprit["rank"] == 2 and culprit["cause"]["class"] == "data_wait", culprit
    assert culprit["cause"]["domain"] == "software" and summary["exclude_hosts"] == []
    assert summary["action"] == "fix_code"
    import subprocess

    terminal = subprocess.run([sys.executable, "-m", "fr_otel.cli", "analyze", str(folder)], capture_output=True,
                              text=True, timeout=120)
    doc = json.loads(subprocess.run([sys.executable, "-m", "fr_otel.cli", "analyze", str(folder), "--json"],
                                    capture_output=True, text=True, timeout=120).stdout)
    assert doc["exclude_hosts"] == [] and doc["action"] == "fix_code", doc["culprits"]
    assert [c["cause"]["domain"] for c in doc["culprits"]] == ["software"]
    assert "What to do: fix the code" in terminal.stdout, terminal.stdout
    page = (folder / "incident.html").read_text()
    for text in (out, terminal.stdout, page):
        assert not [w for w in DRAIN_WORDS if w in text], [w for w in DRAIN_WORDS if w in text]
    print(f"first rank ended {took:.1f} s and the job {exited - stall['time']:.1f} s after the stall began "
          f"(stall threshold {STALL_S:g} s, gloo timeout 300 s), exit {code}")


def test_abort_then_torchrun_restarts_the_job_and_the_second_attempt_runs_through(
        tmp_path: Path, jobs: list[Job]) -> None:
    """torchrun --max-restarts 1: the ranks stuck in the hang end, torchrun starts the job again (new pids), and
    the second attempt, which stalls nowhere, completes: every rank's done marker, exit 0."""
    with OtlpGrpcReceiver() as rx:
        jobs.append(job := _abort_job(tmp_path, rx, "--max-restarts", "1"))
        took, first, _ = _first_rank_ended(job, tmp_path, rx)
        assert job.wait(180) == 0, job.output[-6000:]
    second = job.rank_pids()
    assert sorted(second) == [0, 1, 2, 3] and not set(second.values()) & set(first.values())
    assert sorted(p.name for p in (tmp_path / "markers").glob("done_rank_*")) == [f"done_rank_{r}" for r in range(4)]
    _ended_lines(job.output)
    print(f"first rank ended {took:.1f} s after the stall began; the restarted job completed")


SBATCH = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "fr-otel.sbatch"


def _sbatch_job(tmp_path: Path, **loop: str) -> Job:
    """deploy/slurm/fr-otel.sbatch with FR_OTEL_ON_HANG=abort, run by bash with a one-node srun/scontrol/sbatch;
    rank 1 stalls 600 s at step 3 (``loop``: how) with a 300 s gloo timeout."""
    from fr_otel.common.ports import free_port_block, unused_tcp_port
    from support.slurm import allocation

    env = job_env(tmp_path, **allocation(tmp_path, job_id="4243"), GPUS_PER_NODE="2",
                  PROMETHEUS_TARGETS_DIR=str(tmp_path / "targets"), TRAIN_SCRIPT=str(TRAIN_LOOP),
                  RDZV_PORT=str(unused_tcp_port()), FR_OTEL_UPSTREAM_OTLP=f"127.0.0.1:{unused_tcp_port()}",
                  FR_OTEL_METRICS_PORT=str(free_port_block(2)), FR_OTEL_STALL_SECONDS=str(STALL_S),
                  FR_OTEL_GATHER_SECONDS="5", OTEL_EXPORTER_OTLP_TIMEOUT="2000", FR_OTEL_EXPORT_GRACE_S="0",
                  FR_OTEL_ON_HANG="abort",
                  TRAIN_LOOP_STALL_RANK="1", TRAIN_LOOP_STALL_STEP="3", TRAIN_LOOP_STALL_SECONDS="600",
                  TRAIN_LOOP_GLOO_TIMEOUT="300", TRAIN_LOOP_STEPS="10", **loop)
    del env["FR_OTEL_OUT_DIR"]  # the script's own: under the submit dir, per job
    return Job(["bash", str(SBATCH)], env, tmp_path, "sbatch")


def _submitted(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "sbatch.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def test_the_shipped_sbatch_script_does_not_resubmit_a_job_hung_in_its_own_code(
        tmp_path: Path, jobs: list[Job]) -> None:
    """Rank 1 blocks in its DataLoader: the job ends with exit 70 about one incident later, and the script says
    to fix the code and submits nothing: a resubmission would hang again, on healthy nodes."""
    jobs.append(job := _sbatch_job(tmp_path, TRAIN_LOOP_STALL_IN="loader"))
    stall = json.loads(wait_file(tmp_path / "markers" / "stall_start.json", job, timeout=120).read_text())
    code = job.wait(ENDED_WITHIN_S + 60)
    took = time.time() - stall["time"]
    assert code == CODE_FAULT_EXIT_CODE, job.output[-6000:]
    assert _submitted(tmp_path) == [] and "not resubmitted: fix the code" in job.output, job.output[-6000:]
    assert not list((tmp_path / "fr-otel-out" / "4243").glob("dumps/*/exclude-hosts.txt"))
    print(f"the batch script ended {took:.1f} s after the stall began and submitted nothing")


def test_the_shipped_sbatch_script_resubmits_a_job_whose_culprit_was_stopped_leaving_no_host_out(
        tmp_path: Path, jobs: list[Job]) -> None:
    """Rank 1 is SIGSTOPped in its stall: nothing says whether its code or its host is at fault (the cause
    `stopped`, domain unknown), so the job ends with exit 75 about one incident later and the script submits
    itself again, the count of resubmissions carried and no host excluded (its host did nothing wrong)."""
    from support.slurm import NODE

    jobs.append(job := _sbatch_job(tmp_path))
    stall = json.loads(wait_file(tmp_path / "markers" / "stall_start.json", job, timeout=120).read_text())
    pids = job.rank_pids()
    os.kill(pids[1], signal.SIGSTOP)
    others = [pid for rank, pid in pids.items() if rank != 1]
    try:  # once a stuck rank has ended the job, let the stopped one take its launcher's SIGTERM, as people would
        assert wait_for(lambda: any(_gone(pid) for pid in others), timeout=ENDED_WITHIN_S + 30, interval=0.05), \
            job.output[-6000:]
    finally:
        os.kill(pids[1], signal.SIGCONT)
    code = job.wait(ENDED_WITHIN_S + 60)
    took = time.time() - stall["time"]
    assert code == ABORT_EXIT_CODE, job.output[-6000:]
    assert _submitted(tmp_path) == [["--export=ALL,FR_OTEL_RESUBMITS=1,FR_OTEL_EXCLUDED=", str(SBATCH)]], \
        job.output[-6000:]
    assert "resubmitting it" in job.output and f"without {NODE}" not in job.output
    assert not list((tmp_path / "fr-otel-out" / "4243").glob("dumps/*/exclude-hosts.txt"))
    incidents = [json.loads(p.read_text())["summary"] for p in (tmp_path / "fr-otel-out" / "4243").glob(
        "dumps/*/incident.json")]
    assert incidents and all(i["action"] == "restart_in_place" for i in incidents), incidents
    causes = [c["cause"] for i in incidents for c in i["culprits"] if c["rank"] == 1]
    assert causes and all(c["class"] == "stopped" and c["domain"] == "unknown" for c in causes), causes
    print(f"the batch script ended {took:.1f} s after the stall began and resubmitted itself in place")


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
