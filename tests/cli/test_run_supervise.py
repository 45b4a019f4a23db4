"""``fr-otel run --on-hang abort`` runs COMMAND as a child: it exits with the ranks' code (70 for a hang in the
job's own code, 75 where a restart can help) when the last attempt ended a hang (torchrun exits 1 for any failed
worker), keeps any other status, and passes SIGTERM on. COMMAND here is a small Python script that writes what
ranks write (``start N``, ``abort N RANK CODE``) and exits as told."""

from __future__ import annotations

import importlib.util
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


SIGNALLED = """
import os, signal, sys, time
for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGALRM):
    signal.signal(sig, lambda signum, _: sys.exit(100 + signum))
print("ready", os.getpid(), os.getpgid(0), flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGQUIT, signal.SIGALRM])
def test_sigint_sigquit_and_sigalrm_are_passed_on_and_the_command_runs_in_a_group_of_its_own(
        tmp_path: Path, sig: signal.Signals) -> None:
    """Each signal sent to the supervisor reaches COMMAND, whose own answer is the exit status: none is swallowed,
    and none ends the supervisor alone with COMMAND left running; COMMAND leads its own process group (a terminal's
    Ctrl-C reaches it once, through the supervisor)."""
    proc = subprocess.Popen([sys.executable, "-m", "fr_otel.cli", "run", "--on-hang", "abort", "--",
                             sys.executable, "-c", SIGNALLED], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.stdout is not None
    word, pid, group = proc.stdout.readline().split()
    assert word == "ready" and pid == group
    assert list(tmp_path.glob("fr-otel-abort-*")) == []  # the mark file is held open, not left at a path
    proc.send_signal(sig)
    assert proc.wait(30) == 100 + sig, proc.stderr.read() if proc.stderr else ""


@pytest.mark.gloo
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torchrun needs the torch extra")
def test_a_supervisor_killed_with_sigkill_takes_torchrun_and_its_ranks_with_it(tmp_path: Path) -> None:
    """SIGKILL of ``fr-otel run --on-hang abort`` (nothing it can catch): torchrun gets SIGTERM from the kernel and
    ends its rank, so no job trains on unsupervised, and no file is left behind."""
    script = tmp_path / "rank.py"
    script.write_text("import os, pathlib, sys, time\n"
                      f"pathlib.Path({str(tmp_path / 'rank.pid')!r}).write_text(str(os.getpid()))\n"
                      "time.sleep(120)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "SLURM_PROCID")}
    proc = subprocess.Popen([sys.executable, "-m", "fr_otel.cli", "run", "--on-hang", "abort", "--", sys.executable,
                             "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(script)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**env, "TMPDIR": str(tmp_path), "FR_OTEL_INCIDENTS": "false"})
    pid_file = tmp_path / "rank.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    rank = int(pid_file.read_text())
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 30
    while _alive(rank) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(rank), "the rank outlived its killed supervisor"
    assert list(tmp_path.glob("fr-otel-abort-*")) == []


def _alive(pid: int) -> bool:
    """The process runs (a zombie waiting for its reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


RESTARTED = """
import os, subprocess, sys
with open(os.environ["FR_OTEL_ABORT_MARK"], "a") as f:
    f.write("start 0\\nabort 0 1 75\\n")
rank = {**os.environ, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "1"}
sys.exit(subprocess.run([sys.executable, "-c", "raise SystemExit(1)"], env=rank).returncode)
"""


def test_an_attempt_that_fails_before_its_process_group_after_an_aborted_one_keeps_its_own_status() -> None:
    """Attempt 0 ended a hang (75); attempt 1's rank fails before ``init_process_group``: its agent said it started
    all the same, so the supervisor exits with the failure's own status (1), not the abort's, without a traceback."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "SLURM_PROCID")}
    out = subprocess.run([sys.executable, "-m", "fr_otel.cli", "run", "--on-hang", "abort", "--",
                          sys.executable, "-c", RESTARTED], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr and "ended a hang" not in out.stderr, out.stderr


def test_a_single_node_job_gets_a_fresh_secret_and_a_multi_node_one_only_its_launcher_s() -> None:
    """``fr-otel run`` hands a single-node job's ranks a secret of their own (another one per run); a job across
    nodes (``--nnodes 2``, srun, a multi-node allocation) gets none from it (each node would make its own), and
    a secret the launcher gave is kept."""
    from fr_otel.cli.run import single_node

    show = "import os; print(os.environ.get('FR_OTEL_JOB_SECRET', 'none'))"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_JOB_SECRET", "SLURM_"))}
    runs = [subprocess.run([sys.executable, "-m", "fr_otel.cli", "run", "--", sys.executable, "-c", show],
                           capture_output=True, text=True, timeout=60, env=env).stdout.strip() for _ in range(2)]
    assert all(len(r) == 64 for r in runs) and runs[0] != runs[1], runs
    given = subprocess.run([sys.executable, "-m", "fr_otel.cli", "run", "--", sys.executable, "-c", show],
                           capture_output=True, text=True, timeout=60, env={**env, "FR_OTEL_JOB_SECRET": "x" * 32})
    assert given.stdout.strip() == "x" * 32
    assert single_node(["torchrun", "--nnodes", "1", "--nproc-per-node", "8", "t.py"], {})
    assert not single_node(["torchrun", "--nnodes", "2", "t.py"], {})
    assert not single_node(["torchrun", "--nnodes=1:4", "t.py"], {})
    assert not single_node(["/usr/bin/srun", "python", "t.py"], {})
    assert not single_node(["torchrun", "t.py"], {"SLURM_JOB_NUM_NODES": "4"})
