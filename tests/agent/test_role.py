"""A launcher is told from a rank by what it runs, never by its environment; a rank with no process group says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fr_otel.agent.role import LAUNCHER_MODULES, launcher_name, rank_variables
from fr_otel.cli.run import BOOTSTRAP_DIR

PY = "/usr/bin/python3"


@pytest.mark.parametrize(("argv", "expected"), [
    ([PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"], "torch.distributed.run"),
    ([PY, "-u", "-W", "ignore", "-mtorch.distributed.run", "train.py"], "torch.distributed.run"),
    ([PY, "-m", "torch.distributed.launch", "--use-env", "train.py"], "torch.distributed.launch"),
    ([PY, "/venv/bin/torchrun", "--standalone", "train.py"], "torchrun"),
    ([PY, "-X", "dev", "/venv/lib/python3.11/site-packages/torch/distributed/run.py", "t.py"], "run.py"),
])
def test_a_launcher_is_known_by_its_command_line_before_it_imports_anything(argv: list[str], expected: str) -> None:
    """torchrun, python -m torch.distributed.run/launch and the run.py file are launchers at start-up."""
    assert launcher_name(argv, modules={}) == expected


@pytest.mark.parametrize("argv", [
    [PY, "train.py", "--local_rank", "0"],
    [PY, "-m", "torch.distributed.run_my_own"],
    [PY, "-m", "mypkg.train", "-m", "torch.distributed.run"],
    [PY, "-c", "import torch"],
    [PY, "/work/torchrun_helpers/train.py"],
    [PY],
])
def test_a_training_script_is_no_launcher_whatever_its_arguments(argv: list[str]) -> None:
    """A script or module that only mentions a launcher in its arguments or folder is not one."""
    assert launcher_name(argv, modules={}) is None


def test_a_launcher_the_command_line_hides_is_known_by_its_modules() -> None:
    """`python -c 'from torch.distributed.run import main; main()'` is a launcher once that module is in."""
    argv = [PY, "-c", "from torch.distributed.run import main; main()"]
    assert launcher_name(argv, modules={"torch", "torch.distributed"}) is None
    for name in LAUNCHER_MODULES:
        assert launcher_name(argv, modules={"torch", name}) == name


def test_checkpointing_imports_no_launcher_module() -> None:
    """torch.distributed.checkpoint loads the elastic agent's modules, so those must not mean launcher."""
    pytest.importorskip("torch")
    code = ("import sys, torch.distributed.checkpoint, torch.distributed.elastic.multiprocessing.errors;"
            "from fr_otel.agent.role import launcher_name; print(launcher_name())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"


def test_rank_variables_are_the_non_empty_ones() -> None:
    """RANK, LOCAL_RANK and SLURM_PROCID count only when set to something."""
    assert rank_variables({"RANK": " 3 ", "LOCAL_RANK": "", "SLURM_PROCID": "0", "WORLD_SIZE": "8"}) == {
        "RANK": "3", "SLURM_PROCID": "0"}
    assert rank_variables({}) == {}


def _under_bootstrap(code: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` started as `fr-otel run` starts a command (the bootstrap first on PYTHONPATH)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "RANK", "LOCAL_RANK", "SLURM_"))}
    path = os.pathsep.join([str(BOOTSTRAP_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])
    full = {**base, "PYTHONPATH": path, "FR_OTEL_AUTOSTART": "1", "FR_OTEL_METRICS_PORT": "off", **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=full, check=False)


def test_a_rank_without_a_process_group_warns_once_saying_what_to_do() -> None:
    """An srun task that never calls init_process_group: one warning after FR_OTEL_PG_WARN_SECONDS, naming
    its pid, the variables that made it a rank, init_process_group, fr_otel.start() and the setting."""
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(2.5)"
    t0 = time.monotonic()
    proc = _under_bootstrap(code, SLURM_PROCID="1", FR_OTEL_PG_WARN_SECONDS="0.5", FR_OTEL_POLL_INTERVAL="0.1")
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 30
    lines = [line for line in proc.stderr.splitlines() if "no process group yet" in line]
    assert len(lines) == 1, proc.stderr
    pid = proc.stdout.split()[0]
    assert re.search(rf"\(pid {pid}, SLURM_PROCID=1\)", lines[0]), lines[0]
    for words in ("init_process_group", "fr_otel.start()", "FR_OTEL_PG_WARN_SECONDS"):
        assert words in lines[0], lines[0]


def test_start_in_a_launcher_starts_nothing_and_claims_nothing(tmp_path: Path) -> None:
    """fr_otel.start() where torch.distributed.run is imported returns None, and FR_OTEL_AGENT_PID stays unset."""
    pytest.importorskip("torch")
    code = ("import os, torch.distributed.run, fr_otel; a = fr_otel.start(metrics_port='off', hooks='none');"
            "print(a, os.environ.get('FR_OTEL_AGENT_PID'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "FR_OTEL_LOG_LEVEL": "debug", "SLURM_PROCID": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "None"]
    assert "runs torch.distributed.run, a launcher, not a rank" in proc.stderr
