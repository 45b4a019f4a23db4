"""A launcher is told from a rank by what it runs, never by its environment; a rank with no process group says so."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fr_otel.agent.guest.role import LAUNCHER_MODULES, launcher_name, rank_variables
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
            "from fr_otel.agent.guest.role import launcher_name; print(launcher_name())")
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


RANK_THEN_CHILD = """
import json, os, subprocess, sys, threading
def me():
    return {"agent": "fr_otel.agent.core" in sys.modules, "modules": len(sys.modules), "threads": threading.active_count()}
if os.environ.get("CHILD_OF_RANK"):
    print(json.dumps(me()))
    sys.exit(0)
child_env = {**os.environ, "CHILD_OF_RANK": "1", **json.loads(os.environ.get("CHILD_EXTRA", "{}"))}
child = subprocess.run([sys.executable, __file__], env=child_env, capture_output=True, text=True, check=True)
print(json.dumps({"rank": me(), "child": json.loads(child.stdout)}))
"""


def _rank_and_child(tmp_path: Path, rank_env: dict[str, str], child_extra: str = "{}") -> dict[str, dict[str, object]]:
    """A process under the bootstrap with ``rank_env`` that starts a child before any process group (the
    child inherits its environment, plus ``child_extra``): what each of them runs."""
    script = tmp_path / "train.py"
    script.write_text(RANK_THEN_CHILD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FR_OTEL_") and k not in ("RANK", "LOCAL_RANK",
                                                                                               "SLURM_PROCID")}
    env.update(PYTHONPATH=os.pathsep.join([str(BOOTSTRAP_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]),
               FR_OTEL_AUTOSTART="1", FR_OTEL_METRICS_PORT="off", FR_OTEL_HOOKS="none", CHILD_EXTRA=child_extra,
               **rank_env)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_child_a_rank_starts_before_its_process_group_runs_no_agent(tmp_path: Path) -> None:
    """A subprocess of a rank (it inherits RANK/LOCAL_RANK before init_process_group) is no rank: the rank
    runs its agent, the child loads none of it and starts no thread."""
    got = _rank_and_child(tmp_path, {"RANK": "0", "LOCAL_RANK": "0"})
    assert got["rank"]["agent"] is True
    assert got["child"]["agent"] is False and got["child"]["threads"] == 1, got
    assert int(got["child"]["modules"]) < int(got["rank"]["modules"]) / 2, got


def test_a_launchers_worker_with_rank_variables_of_its_own_still_runs_an_agent(tmp_path: Path) -> None:
    """A process taken for a rank (SLURM_PROCID=0, a launcher fr-otel does not know) whose child gets RANK and
    LOCAL_RANK of its own, as a launcher's worker does: the child is a rank and runs its agent."""
    got = _rank_and_child(tmp_path, {"SLURM_PROCID": "0"}, '{"RANK": "1", "LOCAL_RANK": "1"}')
    assert got["rank"]["agent"] is True and got["child"]["agent"] is True, got
