"""Every documented way to launch a job puts one agent in each training rank and none anywhere else.

Real 2-rank gloo jobs under each launcher. "An agent in every rank": each rank's ``/metrics``
answers on base port + local rank with that rank's ``fr_info``, and its debug line
``agent started in pid P`` names that rank's pid once. "Nowhere else": no other process logs
that line (not torchrun, not a wrapper around it), no launcher warns that it has no process
group, and the one start-up line of the host comes from local rank 0. Every rank holds at
its last step (``TRAIN_LOOP_HOLD``) until the test has looked, then the job ends normally.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from support.jobs import TRAIN_LOOP, Job, installed_bin, job_env
from support.kubernetes import container, kubelet_env, pod_spec, replace_once, volumes
from support.slurm import allocation

from fr_otel.testing.otlp import wait_for
from fr_otel.common.ports import free_port_block, unused_tcp_port

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
]

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "deploy" / "slurm" / "fr-otel.sbatch"
NPROC = 2
STARTED = re.compile(r"agent started in pid (\d+) ")
NO_GROUP = re.compile(r"no process group yet, .*?\(pid (\d+),")


def _launch_env(tmp: Path, base: int, **extra: str) -> dict[str, str]:
    """Debug lines on (the per-pid start line), a 1 s no-process-group warning (a launcher that
    kept an agent would warn), every rank holding at its end until the test releases it."""
    return job_env(tmp, **{"FR_OTEL_LOG_LEVEL": "debug", "FR_OTEL_PG_WARN_SECONDS": "1", "FR_OTEL_POLL_INTERVAL": "0.2",
                           "TRAIN_LOOP_STEPS": "5", "TRAIN_LOOP_HOLD": str(tmp / "release"), **extra,
                           "FR_OTEL_METRICS_PORT": str(base)})


def _scrape(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def _rank_info(url: str) -> dict[str, str] | None:
    """The labels of ``fr_info`` at ``url``, or None while nothing answers there."""
    match = re.search(r"^fr_info\{(.*?)\}", _scrape(url), flags=re.MULTILINE)
    return dict(re.findall(r'(\w+)="([^"]*)"', match.group(1))) if match else None


def _check_one_agent_per_rank(job: Job, tmp: Path, urls: dict[int, str]) -> None:
    """While the job holds: local rank r answers at urls[r] as itself. Then release it, and the log
    shows one agent per rank pid, none elsewhere, and one start-up line (local rank 0's)."""
    def all_up() -> bool:
        return all(_rank_info(url) is not None for url in urls.values()) or job.proc.poll() is not None

    try:
        assert wait_for(all_up, timeout=120, interval=0.2), job.output[-4000:]
        for local, url in urls.items():
            info = _rank_info(url)
            assert info is not None, f"no agent answers at {url}:\n{job.output[-4000:]}"
            assert (info["rank"], info["local_rank"], info["world_size"]) == (str(local), str(local), str(NPROC))
    finally:
        (tmp / "release").touch()
    assert job.wait() == 0, job.output[-4000:]
    out = job.output
    ranks = job.rank_pids()
    assert sorted(ranks) == list(range(NPROC)), out[-4000:]
    assert Counter(STARTED.findall(out)) == Counter(str(pid) for pid in ranks.values()), out[-4000:]
    assert set(NO_GROUP.findall(out)) <= {str(pid) for pid in ranks.values()}, out[-4000:]
    assert re.findall(r"agent on \(rank (\d+) of (\d+)\)", out) == [("0", str(NPROC))], out[-4000:]


def _local_urls(base: int, host: str = "127.0.0.1") -> dict[int, str]:
    return {r: f"http://{host}:{base + r}/metrics" for r in range(NPROC)}


def _torchrun(bin_dir: Path, *args: str) -> list[str]:
    return [str(bin_dir / "torchrun"), "--standalone", f"--nproc-per-node={NPROC}", *args, str(TRAIN_LOOP)]


def test_fr_otel_run_around_torchrun_starts_one_agent_per_rank_even_with_start_in_the_script(
        tmp_path: Path, jobs: list[Job]) -> None:
    """`fr-otel run -- torchrun` whose script also calls fr_otel.start(): one agent per worker, none in torchrun,
    and none in the multiprocessing (spawn) child each worker starts before init_process_group."""
    base = free_port_block(NPROC)
    bin_dir = installed_bin(tmp_path / "bin")
    env = _launch_env(tmp_path, base, TRAIN_LOOP_AGENT="late", TRAIN_LOOP_CHILD="spawn")
    jobs.append(job := Job([str(bin_dir / "fr-otel"), "run", "--", *_torchrun(bin_dir)], env, tmp_path))
    _check_one_agent_per_rank(job, tmp_path, _local_urls(base))


def test_the_shipped_sbatch_script_starts_an_agent_in_every_rank_and_none_in_torchrun(
        tmp_path: Path, jobs: list[Job]) -> None:
    """deploy/slurm/fr-otel.sbatch, run by bash with a one-node srun/scontrol: `srun fr-otel run -- torchrun`
    gives torchrun SLURM_PROCID; every rank still serves at the targets the script wrote for Prometheus."""
    base = free_port_block(NPROC)
    targets_dir = tmp_path / "targets"
    env = _launch_env(tmp_path, base, **allocation(tmp_path, job_id="4242"), GPUS_PER_NODE=str(NPROC),
                      PROMETHEUS_TARGETS_DIR=str(targets_dir), TRAIN_SCRIPT=str(TRAIN_LOOP),
                      RDZV_PORT=str(unused_tcp_port()), FR_OTEL_UPSTREAM_OTLP=f"127.0.0.1:{unused_tcp_port()}")
    jobs.append(job := Job(["bash", str(SBATCH)], env, tmp_path, "sbatch"))
    targets = targets_dir / "fr-otel-slurm-4242.json"
    assert wait_for(lambda: targets.is_file() or job.proc.poll() is not None, timeout=30), job.output[-4000:]
    (group,) = json.loads(targets.read_text())
    assert group["labels"]["training_job"] == "slurm-4242"
    _check_one_agent_per_rank(job, tmp_path, {r: f"http://{t}/metrics" for r, t in enumerate(group["targets"])})
    sruns = [json.loads(line) for line in (tmp_path / "srun.jsonl").read_text().splitlines()]
    training = next(s for s in sruns if s["command"][:4] == ["fr-otel", "run", "--", "torchrun"])
    assert training["tasks"] == 1, "one torchrun per node, with SLURM_PROCID set"


def test_srun_one_task_per_rank_runs_an_agent_in_each_task(tmp_path: Path, jobs: list[Job]) -> None:
    """`srun --ntasks=2 fr-otel run -- python train.py` (no torchrun): each task is a rank by SLURM_PROCID; the
    subprocess each task starts before init_process_group is none."""
    base = free_port_block(NPROC)
    env = _launch_env(tmp_path, base, **allocation(tmp_path), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(unused_tcp_port()), TRAIN_LOOP_CHILD="subprocess")
    srun = Path(env["PATH"].split(":")[0]) / "srun"
    cmd = [str(srun), f"--ntasks={NPROC}", "fr-otel", "run", "--", sys.executable, str(TRAIN_LOOP)]
    jobs.append(job := Job(cmd, env, tmp_path))
    _check_one_agent_per_rank(job, tmp_path, _local_urls(base))


def test_torchrun_alone_with_start_in_the_script_runs_an_agent_in_every_rank(tmp_path: Path, jobs: list[Job]) -> None:
    """torchrun with fr_otel.start() before init_process_group in the script (no fr-otel run), under srun's variables."""
    base = free_port_block(NPROC)
    bin_dir = installed_bin(tmp_path / "bin")
    env = _launch_env(tmp_path, base, TRAIN_LOOP_AGENT="early", SLURM_PROCID="0", SLURM_LOCALID="0",
                      SLURM_NTASKS="1", SLURM_JOB_ID="77")
    jobs.append(job := Job(_torchrun(bin_dir), env, tmp_path))
    _check_one_agent_per_rank(job, tmp_path, _local_urls(base))


def test_a_launcher_hidden_in_a_wrapper_stops_its_agent_and_its_workers_start_theirs(
        tmp_path: Path, jobs: list[Job]) -> None:
    """Under srun, `fr-otel run -- python -c 'torchrun main()'`: its command line hides the launcher, so its
    agent starts, then stops quietly once torch.distributed.run is imported and claims nothing."""
    base = free_port_block(NPROC)
    # The default no-process-group bound: this launcher is known only once torch is imported.
    env = _launch_env(tmp_path, base, SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NTASKS="1",
                      FR_OTEL_PG_WARN_SECONDS="300")
    wrapper = "import sys; from torch.distributed.run import main; sys.exit(main())"
    cmd = [sys.executable, "-m", "fr_otel.cli", "run", "--", sys.executable, "-c", wrapper, "--standalone",
           f"--nproc-per-node={NPROC}", str(TRAIN_LOOP)]
    jobs.append(job := Job(cmd, env, tmp_path))
    launcher = str(job.proc.pid)  # fr-otel run becomes the command: same pid
    out = ""
    try:
        assert wait_for(lambda: f"pid {launcher} runs torch.distributed.run, a launcher" in job.output
                        or job.proc.poll() is not None, timeout=60, interval=0.1), job.output[-4000:]
        out = job.output
        assert f"agent started in pid {launcher} " in out  # it did start: nothing on its command line says launcher
        assert wait_for(lambda: all(_rank_info(u) for u in _local_urls(base).values()) or job.proc.poll() is not None,
                        timeout=120, interval=0.2), job.output[-4000:]
        for local, url in _local_urls(base).items():
            assert (_rank_info(url) or {}).get("rank") == str(local), job.output[-4000:]
    finally:
        (tmp_path / "release").touch()
    assert job.wait() == 0, job.output[-4000:]
    out = job.output
    started = Counter(STARTED.findall(out))
    assert started == Counter([launcher, *(str(p) for p in job.rank_pids().values())]), out[-4000:]


# ----------------------------------------------------------------------------------------------
# Kubernetes: the example manifest's trainer, run here as the kubelet would start it
# ----------------------------------------------------------------------------------------------
def test_the_kubernetes_example_trainer_runs_an_agent_in_every_rank_even_with_an_operators_rank(
        tmp_path: Path, jobs: list[Job]) -> None:
    """The example's trainer command and env, with RANK=0 as PyTorchJob sets it for the pod's torchrun:
    one agent per worker, none in torchrun. (8 GPUs become 2 ranks; the port base a free block.)"""
    spec = pod_spec()
    trainer = container(spec, "trainer")
    env_k8s = kubelet_env(trainer, {"status.hostIP": "127.0.0.1", "spec.nodeName": "k8s-node-3"},
                          volumes(spec, trainer, tmp_path))
    assert env_k8s["FR_OTEL_METRICS_PORT"] == str(trainer["ports"][0]["containerPort"])
    base = free_port_block(NPROC)
    env = _launch_env(tmp_path, base, **env_k8s,
                      PATH=f"{installed_bin(tmp_path / 'bin')}:{job_env(tmp_path)['PATH']}",
                      RANK="0", WORLD_SIZE="1", PET_MASTER_PORT=str(unused_tcp_port()))
    cmd = replace_once(trainer["command"], "--nproc-per-node=8", f"--nproc-per-node={NPROC}")
    cmd = replace_once(cmd, "train.py", str(TRAIN_LOOP))
    jobs.append(job := Job(cmd, env, tmp_path))
    _check_one_agent_per_rank(job, tmp_path, _local_urls(base))
