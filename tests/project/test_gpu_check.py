"""scripts/gpu-check.sh, the GPU path's prepared check, as far as a machine without a GPU can test it.

The real run needs an NVIDIA GPU (a CUDA torch, NCCL, ``torch.cuda._sleep``); here: its syntax, its
arguments, its refusal without ``nvidia-smi``, the commands ``--dry-run`` shows, the job's refusal
without CUDA, the judges that read ``fr-otel analyze --json``, and the whole script's flow on a
stand-in machine (a fake ``nvidia-smi``, ``torchrun`` and ``fr-otel`` that leave what the real ones
would), so a GPU session spends its minutes on the GPU, not on a typo.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"
JOB = REPO / "scripts" / "gpu_check_job.py"
BASH = shutil.which("bash") or "/bin/bash"


def check(args: list[str], *, path: str | None = None, cwd: Path | None = None,
          extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the script as a user would (bash, the given PATH), never longer than a minute."""
    env = {**os.environ, **(extra_env or {})}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([BASH, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd or REPO, check=False)


def bare_path(tmp_path: Path, *tools: str) -> str:
    """A PATH holding only the named tools (and no nvidia-smi, whatever this machine has)."""
    folder = tmp_path / "bare-bin"
    folder.mkdir(exist_ok=True)
    for tool in ("dirname", *tools):
        found = shutil.which(tool)
        assert found, tool
        if not (folder / tool).exists():
            (folder / tool).symlink_to(found)
    return str(folder)


def load_job() -> ModuleType:
    """The job script as a module (it is no package's), for its judges."""
    spec = importlib.util.spec_from_file_location("gpu_check_job", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_is_valid_bash_and_shellcheck_finds_nothing() -> None:
    """A syntax error would cost a GPU session its first run; shellcheck (where installed) catches more."""
    parsed = subprocess.run([BASH, "-n", str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
    assert parsed.returncode == 0, parsed.stderr
    assert os.access(SCRIPT, os.X_OK), "scripts/gpu-check.sh must be executable"
    assert SCRIPT.read_text().splitlines()[:1] == ["#!/usr/bin/env bash"]
    assert "set -euo pipefail" in SCRIPT.read_text()
    shellcheck = shutil.which("shellcheck")
    if shellcheck is not None:  # optional: this check alone is left out without it
        linted = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
        assert linted.returncode == 0, linted.stdout + linted.stderr


def test_help_names_every_option_and_needs_no_gpu(tmp_path: Path) -> None:
    """-h prints the usage (exit 0) on any machine: no nvidia-smi is looked for."""
    done = check(["-h"], path=bare_path(tmp_path, "cat"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: scripts/gpu-check.sh")
    for option in ("--venv", "--torch-index", "--skip-install", "--out", "--timeout", "--dry-run", "-h"):
        assert option in done.stdout
    assert "https://download.pytorch.org/whl/cu128" in done.stdout and "2.13.0" in done.stdout
    assert check(["--help"], path=bare_path(tmp_path, "cat")).stdout == done.stdout


@pytest.mark.parametrize(("args", "says"), [
    (["--frobnicate"], "unknown option: --frobnicate"),
    (["--dry-run", "extra"], "unknown option: extra"),
    (["--out"], "--out needs a value"),
    (["--venv="], "--venv needs a value"),
    (["--timeout", "soon"], "--timeout needs a whole number of seconds"),
    (["--timeout=0"], "--timeout needs a whole number of seconds"),
])
def test_a_bad_argument_is_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    """A usage error is exit 2 and one line naming it, before anything is looked for or run."""
    done = check(args, path=bare_path(tmp_path))
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr


def test_without_nvidia_smi_it_refuses_in_one_line(tmp_path: Path) -> None:
    """No nvidia-smi on PATH (no GPU here): exit 2 with one line that names it; nothing is created."""
    out = tmp_path / "out"
    done = check(["--out", str(out), "--venv", str(tmp_path / "venv")], path=bare_path(tmp_path))
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and "nvidia-smi" in done.stderr, done.stderr
    assert not out.exists() and not (tmp_path / "venv").exists()


def test_dry_run_shows_every_command_and_runs_none(tmp_path: Path) -> None:
    """--dry-run (no GPU needed) prints the install, both torchrun jobs with their variables and the
    analyses, each as a line a shell could run; it creates neither the venv nor the output folder."""
    out, venv = tmp_path / "out", tmp_path / "venv"
    done = check(["--dry-run", "--out", str(out), "--venv", str(venv)], path=bare_path(tmp_path, "date"))
    assert done.returncode == 0, done.stderr
    commands = [line[2:] for line in done.stdout.splitlines() if line.startswith("+ ")]
    text = "\n".join(commands)
    assert f"-m venv {venv}" in text
    assert "pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" in text
    assert f"pip install -q -e {REPO}" in text
    live, watchdog = (next(c for c in commands if f"--mode {mode}" in c and "torchrun" in c)
                      for mode in ("live", "watchdog"))
    for job in (live, watchdog):
        assert f"{venv}/bin/torchrun --standalone --nproc-per-node 1 {JOB}" in job
        assert job.startswith("timeout ")
    assert f"{venv}/bin/fr-otel run -- " in live and "FR_OTEL_STALL_SECONDS=5" in live
    assert f"FR_OTEL_OUT_DIR={out}/live/fr-otel-out" in live
    assert "fr-otel run" not in watchdog and "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in watchdog
    assert f"TORCH_FR_DUMP_TEMP_FILE={out}/watchdog/dumps/nccl_trace_rank_" in watchdog
    assert f"{venv}/bin/fr-otel analyze --json {out}/watchdog/dumps > {out}/watchdog/analysis.json" in text
    assert f"{venv}/bin/fr-otel analyze --json {out}/live/fr-otel-out/dumps/" in text
    assert "--mode judge-live" in text and "--mode judge-offline" in text
    assert "dry run: nothing was run" in done.stdout
    assert not out.exists() and not venv.exists()


def test_dry_run_options_change_the_install(tmp_path: Path) -> None:
    """--skip-install installs nothing; --wheels installs offline from a folder; --torch-index is used."""
    bare = bare_path(tmp_path, "date")
    skipped = check(["--dry-run", "--skip-install", "--out", str(tmp_path / "o")], path=bare)
    assert skipped.returncode == 0 and "pip install" not in skipped.stdout and "torchrun" in skipped.stdout
    offline = check(["--dry-run", f"--wheels={tmp_path / 'whl'}", "--torch-index", "https://example.invalid/cu126",
                     "--out", str(tmp_path / "o")], path=bare)
    assert offline.returncode == 0, offline.stderr
    assert f"--no-index --find-links {tmp_path / 'whl'}" in offline.stdout and "example.invalid" not in offline.stdout
    index = check(["--dry-run", "--torch-index", "https://example.invalid/cu126", "--out", str(tmp_path / "o")],
                  path=bare)
    assert "--index-url https://example.invalid/cu126" in index.stdout


def test_the_job_without_cuda_says_so_in_one_line() -> None:
    """On a machine without CUDA (this one; a GPU hidden with CUDA_VISIBLE_DEVICES on one that has it)
    the job exits 2 with one line, no traceback, before it starts any process group."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for mode in ("live", "watchdog"):
        done = subprocess.run([sys.executable, str(JOB), "--mode", mode], capture_output=True, text=True,
                              timeout=120, env=env, check=False)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and "CUDA is not available" in lines[0], done.stderr
    bad = subprocess.run([sys.executable, str(JOB), "--mode", "judge-live"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and "--analysis" in bad.stderr


def analysis(**changes: Any) -> dict[str, Any]:
    """The shape of `fr-otel analyze --json` for the held all_reduce of a one-rank NCCL job."""
    base: dict[str, Any] = {"verdict": "hang", "ranks_loaded": 1, "world_size": 1, "backends": ["nccl"],
                            "culprits": [{"rank": 0, "kind": "not_completed"}]}
    return {**base, **changes}


@pytest.mark.parametrize(("data", "live_ok"), [
    (analysis(culprits=[{"rank": 0, "kind": "device"}]), True),
    (analysis(culprits=[{"rank": 0, "kind": "not_completed", "cause": {"class": "device"}}]), True),
    (analysis(verdict="inconclusive", culprits=[], cause={"class": "device"}), True),
    (analysis(), False),
    (analysis(culprits=[{"rank": 0, "kind": "not_completed", "cause": {"class": "cpu"}}]), False),
    (analysis(culprits=[{"rank": 0, "kind": "not_completed", "cause": "device"}]), False),
])
def test_the_live_judge_wants_a_culprit_named_device(tmp_path: Path, data: dict[str, Any], live_ok: bool) -> None:
    """The live step passes only when the analysis names `device` (kind, or cause.class where there is a cause);
    the offline step only needs the NCCL dump read. Either way the line says what was found."""
    job = load_job()
    path = tmp_path / "analysis.json"
    path.write_text(json.dumps(data))
    assert job.names_device(data) is live_ok
    found = job.describe(data)
    assert f"verdict {data['verdict']}" in found and "backends nccl" in found
    assert job.judge("judge-offline", path) == 0
    done = subprocess.run([sys.executable, str(JOB), "--mode", "judge-live", "--analysis", str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == (0 if live_ok else 1), done.stdout + done.stderr
    said = (done.stdout + done.stderr).strip().splitlines()
    assert len(said) == 1 and found in said[0]


@pytest.mark.parametrize(("content", "why"), [
    (json.dumps(analysis(backends=["gloo"])), "not read as NCCL's"),
    (json.dumps(analysis(ranks_loaded=0)), "no rank's dump was loaded"),
    ("[1, 2]", "not one JSON object"),
    ("{not json", "cannot read the analysis"),
])
def test_both_judges_refuse_what_is_not_an_nccl_analysis(tmp_path: Path, content: str, why: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A gloo dump, no dump at all or a broken file fails both steps, saying which."""
    job = load_job()
    path = tmp_path / "analysis.json"
    path.write_text(content)
    for mode in ("judge-live", "judge-offline"):
        assert job.judge(mode, path) == 1
        assert why in capsys.readouterr().err


# --- The whole script on a stand-in machine ----------------------------------------------------------

FAKE_NVIDIA_SMI = """#!/usr/bin/env bash
echo "GPU 0: Stand-in GPU (UUID: GPU-00000000)"
"""
# The venv's python answers the install check as a CUDA torch would; everything else is the real Python.
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "${1:-}" = -W ]; then echo "torch 2.13.0+cu128 (CUDA 12.8, available: True), fr-otel 0.0"; exit 0; fi
exec REAL_PYTHON "$@"
"""
# `fr-otel run` raises the incident the agent would (FAKE_INCIDENT=1); `analyze` answers from FAKE_ANALYSES.
FAKE_FR_OTEL = """#!/usr/bin/env bash
case "$1" in
  run)
    if [ "${FAKE_INCIDENT:-0}" = 1 ]; then
      mkdir -p "$FR_OTEL_DUMP_DIR/5f0c"
      echo '{}' > "$FR_OTEL_DUMP_DIR/5f0c/incident.json"
    fi
    echo "fake fr-otel run: ${*:2}"
    exit "${FAKE_LIVE_EXIT:-0}" ;;
  analyze)
    if [ "$2" = --json ]; then cat "$FAKE_ANALYSES/$(basename "$3").json"; else echo "fr-otel: a verdict"; fi ;;
esac
"""
# The watchdog writes its dump (FAKE_DUMP=1), then aborts the process, as NCCL does.
FAKE_TORCHRUN = """#!/usr/bin/env bash
[ "${FAKE_DUMP:-0}" = 1 ] && printf 'a dump' > "${TORCH_FR_DUMP_TEMP_FILE}0"
echo "fake torchrun: $*"
exit 1
"""


def stand_in(tmp_path: Path, live: dict[str, Any], offline: dict[str, Any]) -> tuple[Path, str, Path]:
    """A venv of stand-ins, a PATH whose nvidia-smi is one, and the analyses `fr-otel analyze --json` gives."""
    venv, tools, analyses = tmp_path / "venv", tmp_path / "tools", tmp_path / "analyses"
    for folder in (venv / "bin", tools, analyses):
        folder.mkdir(parents=True)
    for where, text in ((tools / "nvidia-smi", FAKE_NVIDIA_SMI), (venv / "bin" / "fr-otel", FAKE_FR_OTEL),
                        (venv / "bin" / "torchrun", FAKE_TORCHRUN),
                        (venv / "bin" / "python", FAKE_PYTHON.replace("REAL_PYTHON", sys.executable))):
        where.write_text(text)
        where.chmod(0o755)
    (analyses / "5f0c.json").write_text(json.dumps(live))
    (analyses / "dumps.json").write_text(json.dumps(offline))
    return venv, f"{tools}{os.pathsep}{os.environ.get('PATH', '')}", analyses


def test_on_a_stand_in_gpu_every_step_passes_and_says_what_it_found(tmp_path: Path) -> None:
    """The flow: the incident folder is found, analysed and judged; the watchdog's dump likewise; one PASS
    line per step, a summary, exit 0; the logs and analyses are left in --out."""
    venv, path, analyses = stand_in(tmp_path, analysis(culprits=[{"rank": 0, "kind": "device"}]), analysis())
    out = tmp_path / "out"
    done = check(["--skip-install", "--venv", str(venv), "--out", str(out), "--timeout", "60"], path=path,
                 extra_env={"FAKE_INCIDENT": "1", "FAKE_DUMP": "1", "FAKE_ANALYSES": str(analyses)})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "gpu-check: GPU 0: Stand-in GPU (UUID: GPU-00000000)"
    assert "gpu-check: PASS install: torch 2.13.0+cu128 (CUDA 12.8, available: True), fr-otel 0.0" in lines
    live = next(line for line in lines if line.startswith("gpu-check: PASS live:"))
    assert f"incident in {out}/live/fr-otel-out/dumps/5f0c" in live and "rank 0 device" in live
    assert any(line.startswith("gpu-check: PASS watchdog: dump read offline (job exit 1)") for line in lines)
    assert lines[-1] == "gpu-check: PASS (all 3 steps)"
    assert json.loads((out / "live" / "analysis.json").read_text())["culprits"][0]["kind"] == "device"
    assert (out / "watchdog" / "dumps" / "nccl_trace_rank_0").read_text() == "a dump"
    assert "fake torchrun" in (out / "watchdog" / "job.log").read_text()


def test_on_a_stand_in_gpu_each_failure_is_named(tmp_path: Path) -> None:
    """No culprit named device, or no incident at all, fails the live step saying what was found; no
    watchdog dump fails that step; the script then exits 1 with the count."""
    venv, path, analyses = stand_in(tmp_path, analysis(), analysis())
    env = {"FAKE_INCIDENT": "1", "FAKE_DUMP": "0", "FAKE_ANALYSES": str(analyses)}
    args = ["--skip-install", "--venv", str(venv), "--timeout", "60"]
    done = check([*args, "--out", str(tmp_path / "one")], path=path, extra_env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    live = next(line for line in lines if line.startswith("gpu-check: FAIL live:"))
    assert "no culprit is named device" in live and "rank 0 not_completed" in live
    assert any(line.startswith("gpu-check: FAIL watchdog: no watchdog dump at") for line in lines)
    assert lines[-1] == "gpu-check: FAIL (2 of 3 steps failed)"

    quiet = check([*args, "--out", str(tmp_path / "two")], path=path, extra_env={**env, "FAKE_INCIDENT": "0"})
    assert quiet.returncode == 1
    assert "gpu-check: FAIL live: no incident raised: no incident.json under" in quiet.stdout


def test_skip_install_without_the_venv_fails_the_install_and_runs_nothing(tmp_path: Path) -> None:
    """--skip-install with a venv that is not there: install fails, the checks are not run, exit 1."""
    _, path, _ = stand_in(tmp_path, analysis(), analysis())
    done = check(["--skip-install", "--venv", str(tmp_path / "absent"), "--out", str(tmp_path / "out")], path=path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gpu-check: FAIL install: --skip-install, but" in done.stdout
    assert "gpu-check: FAIL live: not run: install failed" in done.stdout
    assert not [line for line in done.stdout.splitlines() if line.startswith("+ ")]  # no command was run
