"""Job ids and incident keys are checked wherever they enter, and escaped where shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.hostile_side_files import small_job, valid_incident

from fr_otel.agent.config import resolve_config
from fr_otel.common.ids import trace_id_for
from fr_otel.trace.ids import job_identity

CLI = [sys.executable, "-m", "fr_otel.cli"]


def run(args: list[str | bytes], env: dict[str, str | bytes] | None = None) -> subprocess.CompletedProcess[str]:
    """fr-otel with raw bytes allowed in argv and the environment (what a shell can pass)."""
    base: dict[str | bytes, str | bytes] = {k: v for k, v in os.environ.items()
                                            if not k.startswith(("OTEL_", "FR_OTEL_", "TORCHELASTIC_", "SLURM_"))}
    base.update(env or {})
    environ = {os.fsencode(k): os.fsencode(v) for k, v in base.items()}
    return subprocess.run([os.fsencode(a) for a in [*CLI, *args]], capture_output=True, env=environ, timeout=120,
                          text=True, errors="backslashreplace")


@pytest.mark.parametrize(("flag", "value"), [
    ("--job-id", b"job\xff"), ("--job-id", "job\x1b]0;owned\x07"), ("--job-id", "j" * 300),
    ("--incident", "3\n4"), ("--incident", b"\xed\xa0\x80"),
])
def test_a_job_id_or_incident_flag_that_is_no_identity_is_a_usage_error(tmp_path: Path, flag: str,
                                                                        value: str | bytes) -> None:
    """A non-UTF-8 byte (a lone surrogate to Python), a control character or 300 characters: exit
    2 with one line naming the flag, nothing written (never a UnicodeEncodeError and a lost trace)."""
    folder = small_job(tmp_path / "dumps")
    result = run(["export", str(folder), "--out", str(tmp_path / "out"), flag, value])
    assert result.returncode == 2, result.stderr
    assert f"argument {flag}:" in result.stderr and "Traceback" not in result.stderr
    assert "\x1b" not in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("name", "value"), [
    ("FR_OTEL_JOB_ID", b"job\xff"), ("FR_OTEL_JOB_ID", "job\x1b[2J"), ("TORCHELASTIC_RUN_ID", "run\x07"),
])
@pytest.mark.parametrize("command", ["export", "watch"])
def test_a_job_id_variable_that_is_no_identity_is_one_line_and_exit_2(tmp_path: Path, name: str,
                                                                      value: str | bytes, command: str) -> None:
    """FR_OTEL_JOB_ID (or a launcher's run id) that an export would use: one line naming it, exit 2,
    as a bad OTEL_* variable is."""
    folder = small_job(tmp_path / "dumps")
    args = ["export", str(folder)] if command == "export" else ["watch", str(folder), "--once"]
    result = run([*args, "--out", str(tmp_path / "out")], {name: value})
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"fr-otel: {name}: the job id") and "\x1b" not in line and "\x07" not in line


def test_the_agent_skips_a_job_id_variable_that_is_no_identity() -> None:
    """Inside a training job nothing stops it: the bad FR_OTEL_JOB_ID is one problem line and the
    next source (here Slurm's job id) names the run."""
    config, problems = resolve_config(environ={"FR_OTEL_JOB_ID": "job\x1b[2J"})
    assert config.job_id is None and len(problems) == 1 and problems[0].startswith("FR_OTEL_JOB_ID: the job id holds")
    env = {"FR_OTEL_JOB_ID": "job\udcff", "SLURM_JOB_ID": "77"}
    assert job_identity(None, env) == ("slurm:77/restart-0", "SLURM_JOB_ID")


def test_an_incident_files_control_characters_reach_neither_terminal_nor_resources(tmp_path: Path) -> None:
    """incident.json's job id with ESC, BEL and an OSC title sequence (its trace id consistent with
    the escaped id): analyze prints it escaped, and the trace's fr_otel.job_id and
    service.instance.id hold the same escaped text."""
    folder = small_job(tmp_path / "dumps")
    escaped = "job\\x1b]0;owned\\x07"
    doc = valid_incident(job_id="job\x1b]0;owned\x07", trace_id=f"{trace_id_for(escaped, '3'):032x}")
    (folder / "incident.json").write_text(json.dumps(doc))
    analysed = run(["analyze", str(folder)])
    assert analysed.returncode == 0 and "\x1b" not in analysed.stdout and escaped in analysed.stdout
    exported = run(["export", str(folder), "--out", str(tmp_path / "out")])
    assert exported.returncode == 0, exported.stderr
    (trace,) = (tmp_path / "out").glob("fr-otel-trace-*.jsonl")
    text = trace.read_text()
    assert "\\u001b" not in text and "\x1b" not in text
    resources = [{a["key"]: a["value"].get("stringValue") for a in rs["resource"]["attributes"]}
                 for line in text.splitlines() for rs in json.loads(line)["resourceSpans"]]
    assert {r["fr_otel.job_id"] for r in resources} == {escaped}
    assert f"{escaped}/rank-3" in {r.get("service.instance.id") for r in resources}


def test_a_non_utf8_service_name_does_not_lose_the_trace(tmp_path: Path) -> None:
    """--service-name and OTEL_RESOURCE_ATTRIBUTES with a byte that is not UTF-8: the trace is
    written, the byte escaped (the direct encoder raised UnicodeEncodeError before)."""
    folder = small_job(tmp_path / "dumps")
    result = run(["export", str(folder), "--out", str(tmp_path / "out"), "--service-name", b"svc\xff"],
                 {"OTEL_RESOURCE_ATTRIBUTES": b"team=a\xffb"})
    assert result.returncode == 0, result.stderr
    (trace,) = (tmp_path / "out").glob("fr-otel-trace-*.jsonl")
    assert "svc\\\\xff" in trace.read_text()
