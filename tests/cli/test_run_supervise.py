"""``fr-otel run --on-hang abort`` runs COMMAND as a child: it exits with the ranks' code (70 for a hang in the
job's own code, 75 where a restart can help) when the last attempt ended a hang (torchrun exits 1 for any failed
worker), keeps any other status, and passes SIGTERM on. COMMAND here is a small Python script that writes what
ranks write (``start N``, ``abort N RANK CODE``) and exits as told."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fr_otel.agent.hang_abort import ABORT_EXIT_CODE, CODE_FAULT_EXIT_CODE

CHILD = """
import os, signal, sys, time
lines, code = sys.argv[1].split(";") if sys.argv[1] else [], int(sys.argv[2])
with open(os.environ["FR_OTEL_ABORT_MARK"], "a") as f:
    f.writelines(line + "\\n" for line in lines)
if code == -15:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    print("ready", flush=True)
    time.sleep(60)
os._exit(code) if code >= 0 else os.kill(os.getpid(), -code)
"""


def _run(lines: list[str], code: int, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fr_otel.cli", "run", "--on-hang", "abort", *flags, "--",
                           sys.executable, "-c", CHILD, ";".join(lines), str(code)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("lines,code,expected", [
    (["start 0", "abort 0 1", "abort 0 3"], 1, ABORT_EXIT_CODE),  # the last attempt ended a hang
    (["start 0", "abort 0 1", "start 1"], 1, 1),  # a later attempt failed on its own: its status
    (["start 0", "abort 0 1", "start 1"], 0, 0),  # torchrun restarted it and it ran through
    (["start 0"], 1, 1),  # no abort
    ([], 0, 0),
    (["start 0", "abort 0 x", "abort zero 1", "garbage"], 1, 1),  # nothing a rank writes
    (["start 0", "abort 0 2"], -9, ABORT_EXIT_CODE),  # killed by a signal after the abort: still the abort's
    (["start 0"], -9, 128 + 9),  # killed by a signal: the shell's convention
    (["start 0", "abort 0 1 70", "abort 0 3 70"], 1, CODE_FAULT_EXIT_CODE),  # a hang in the job's code: fix it
    (["start 0", "abort 0 1 75", "abort 0 3 75"], 1, ABORT_EXIT_CODE),
    (["start 0", "abort 0 1 70", "start 1"], 0, 0),  # restarted anyway (torchrun cannot tell) and ran through
    (["start 0", "abort 0 1 99"], 1, ABORT_EXIT_CODE),  # a code no rank writes: the restart's
])
def test_the_exit_status_says_whether_the_last_attempt_ended_a_hang(lines: list[str], code: int, expected: int) -> None:
    out = _run(lines, code)
    assert out.returncode == expected, out.stderr
    said = f"ended a hang (--on-hang abort): exit code {expected}" in out.stderr
    assert said == (expected in (ABORT_EXIT_CODE, CODE_FAULT_EXIT_CODE)), out.stderr
    assert ("do not resubmit" in out.stderr) == (expected == CODE_FAULT_EXIT_CODE), out.stderr


def test_sigterm_is_passed_on_and_the_mark_file_removed(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "fr_otel.cli", "run", "--on-hang", "abort", "--",
                             sys.executable, "-c", CHILD, "", "-15"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 3  # the child's own answer to SIGTERM, passed through
    time.sleep(0.1)
    assert list(tmp_path.glob("fr-otel-abort-*")) == []


def test_without_abort_fr_otel_run_becomes_the_command() -> None:
    """The default (report) keeps exec: the exit status is the command's own, with no file and no parent left."""
    out = subprocess.run([sys.executable, "-m", "fr_otel.cli", "run", "--", sys.executable, "-c",
                          "import os; print('FR_OTEL_ABORT_MARK' in os.environ, os.getppid())"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["False", str(os.getpid())]  # our child: fr-otel run exec'd
