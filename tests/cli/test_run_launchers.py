"""``fr-otel run`` says in one line when COMMAND may start ranks on other hosts without its environment, and the fix.

COMMAND is a stand-in named as the launcher (a script that exits 0): what is said depends on the name alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.jobs import write_executable


def _run(tmp: Path, name: str) -> subprocess.CompletedProcess[str]:
    launcher = tmp / name
    write_executable(launcher, "#!/bin/sh\nexit 0\n")
    return subprocess.run([sys.executable, "-m", "fr_otel.cli", "run", "--", str(launcher), "-np", "2", "train.py"],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("name", "fix"), [("mpirun", "mpirun -x PYTHONPATH -x FR_OTEL_AUTOSTART"),
                                           ("deepspeed", ".deepspeed_env")])
def test_a_launcher_that_may_leave_the_environment_behind_gets_one_line_with_the_fix(
        tmp_path: Path, name: str, fix: str) -> None:
    """mpirun, deepspeed: one line naming the launcher, its way to pass the environment on, and fr_otel.start()."""
    proc = _run(tmp_path, name)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"fr-otel: {name} may start ranks on other hosts") and fix in line, line
    assert "fr_otel.start() at the top of the training script" in line


def test_a_launcher_that_passes_the_environment_on_gets_no_line(tmp_path: Path) -> None:
    """torchrun (and any command fr-otel run knows nothing of) starts quietly."""
    proc = _run(tmp_path, "torchrun")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
