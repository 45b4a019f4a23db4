"""What a first real trial tripped over: `fr-otel run` launch safety, the agent's start-up line,
help texts, export error hints and progress bars. Every command runs for real, in a fresh
interpreter (progress under a real pseudo-terminal)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FR_OTEL_", "OTEL_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra)
    return env


def _fr_otel(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fr_otel.cli", *args], capture_output=True, text=True,
                          env=env if env is not None else _env(), timeout=timeout)


# ------------------------------------------------------------------------------------------------
# 1. fr-otel run never refuses to launch because of fr-otel's own settings
# ------------------------------------------------------------------------------------------------
HELLO = [sys.executable, "-c", "import os; print('hello', os.environ.get('FR_OTEL_STALL_SECONDS', 'unset'))"]


@pytest.mark.parametrize(("args", "env", "warning", "stall"), [
    ([], {"FR_OTEL_STALL_SECONDS": "abc"}, "FR_OTEL_STALL_SECONDS: expected a positive number of seconds, got 'abc'",
     "unset"),
    (["--stall-seconds", "abc"], {}, "--stall-seconds: expected a positive number of seconds, got 'abc'", "unset"),
    (["--stall-seconds", "abc"], {"FR_OTEL_STALL_SECONDS": "30"}, "--stall-seconds: expected", "30"),
    (["--stall-seconds=7"], {"FR_OTEL_STALL_SECONDS": "abc"}, None, "7"),
    (["--metrics-port", "http"], {"FR_OTEL_HOOKS": "nope"}, "--metrics-port: expected", "unset"),
    (["--protocol", "http/xml"], {}, "--protocol: expected one of grpc, http/protobuf, http/json", "unset"),
    (["--stal-seconds", "5"], {}, "unknown flag --stal-seconds ignored", "unset"),
    (["--stall-seconds"], {}, "--stall-seconds needs a value", "unset"),
    ([], {"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, "OTEL_EXPORTER_OTLP_PROTOCOL: expected one of", "unset"),
    ([], {"FR_OTEL_LOG_LEVEL": "loud", "FR_OTEL_ENABLED": "maybe"}, "FR_OTEL_ENABLED: expected true or false", "unset"),
], ids=["bad-variable", "bad-flag", "bad-flag-good-variable", "good-flag-bad-variable", "two-bad", "bad-protocol",
        "unknown-flag", "flag-without-value", "bad-otel-variable", "bad-level-and-bool"])
def test_bad_settings_warn_once_and_still_run_the_command(
        args: list[str], env: dict[str, str], warning: str | None, stall: str) -> None:
    """A bad flag or FR_OTEL_*/OTEL_* value is one warning line; the command runs, and gets only
    the valid value (so its ranks do not warn again)."""
    proc = _fr_otel("run", *args, "--", *HELLO, env=_env(**env))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"hello {stall}\n"
    lines = proc.stderr.splitlines()
    if warning is None:
        assert lines == []
    else:
        assert any(warning in line for line in lines), lines
        assert all(line.startswith("fr-otel: ") and line.endswith("(the job starts anyway)") for line in lines)
        assert len(lines) == len(set(lines)) and len(lines) <= 2 and "Traceback" not in proc.stderr


def test_run_without_a_command_is_the_only_usage_error() -> None:
    """No COMMAND: exit 2 with an example; a help request prints help."""
    proc = _fr_otel("run", "--stall-seconds", "9")
    assert proc.returncode == 2 and "run needs a command after --" in proc.stderr
    assert _fr_otel("run", "--stall-seconds", "abc", "--help").returncode == 0


def test_run_accepts_a_command_without_the_separator() -> None:
    """`fr-otel run --stall-seconds 5 python -c ...` works like the form with --."""
    proc = _fr_otel("run", "--stall-seconds", "5", *HELLO)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "hello 5\n", "")


# ------------------------------------------------------------------------------------------------
# 5. one line at agent start on local rank 0
# ------------------------------------------------------------------------------------------------
ONE_RANK = """
import time, torch.distributed as dist
dist.init_process_group("gloo")
time.sleep(1.5)
dist.destroy_process_group()
print("training ran")
"""


def _one_rank_job(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1", FR_OTEL_POLL_INTERVAL="0.2", FR_OTEL_METRICS_PORT="0",
               FR_OTEL_METRICS_ADDR="127.0.0.1", FR_OTEL_OUT_DIR=str(tmp_path / "out"), **extra)
    script = tmp_path / "one_rank.py"
    script.write_text(ONE_RANK)
    return _fr_otel("run", "--", sys.executable, str(script), env=env)


@pytest.mark.gloo
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the torch extra")
def test_agent_says_once_what_it_serves_and_where_incidents_go(tmp_path: Path) -> None:
    """Local rank 0 logs one start-up line (metrics URL, dump folder, trace destination) at the
    default level; FR_OTEL_LOG_LEVEL=warning silences it. A bad variable is reported once, by
    `fr-otel run`, not again by the rank."""
    proc = _one_rank_job(tmp_path, FR_OTEL_STALL_SECONDS="abc")
    assert proc.returncode == 0 and "training ran" in proc.stdout, proc.stderr
    agent = [line for line in proc.stderr.splitlines() if line.startswith("fr-otel")]
    assert len(agent) == 2, agent
    assert "FR_OTEL_STALL_SECONDS" in agent[0] and "(the job starts anyway)" in agent[0]
    line = agent[1]
    assert line.startswith("fr-otel[rank 0]: agent on (rank 0 of 1): /metrics at http://127.0.0.1:"), line
    assert "over 60 s" in line, "the bad value fell back to the default"
    assert f"dumps in {tmp_path / 'out' / 'dumps'}/" in line and f"OTLP JSON in {tmp_path / 'out'}/" in line

    quiet = _one_rank_job(tmp_path, FR_OTEL_LOG_LEVEL="warning")
    assert quiet.returncode == 0 and "training ran" in quiet.stdout, quiet.stderr
    assert "fr-otel" not in quiet.stderr, quiet.stderr
