"""`fr-otel demo` refuses bad settings in one line, before it starts any job or writes any file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _demo(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "OTEL_"))}
    return subprocess.run([sys.executable, "-m", "fr_otel.cli", "demo", *args], cwd=cwd, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("args", "env", "said"), [
    (["--endpoint", "ftp://collector:4317"], {}, "fr-otel: endpoint argument: a gRPC endpoint is host:port"),
    ([], {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://collector:4317"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    (["--headers", "no-equals-sign"], {}, "expected 'key=value[,key2=value2]', got 'no-equals-sign'"),
    (["--metrics-port", "70000"], {}, "--metrics-port: expected a port from 1 to 65532, got 70000"),
])
def test_a_bad_setting_is_one_line_and_exit_2_with_nothing_started(tmp_path: Path, args: list[str],
                                                                    env: dict[str, str], said: str) -> None:
    """A bad endpoint (flag or OTEL_* variable), header or metrics port: exit 2, the problem in one line,
    no traceback, no job output and no file under the working directory."""
    proc = _demo(tmp_path, *args, env=env)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "Traceback" not in proc.stderr
    assert "fr-otel demo: starting" not in proc.stderr and proc.stdout == ""
    assert list(tmp_path.iterdir()) == []
