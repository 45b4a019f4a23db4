"""A trace that is lost (a full --out) exits 4, not 3 like a spooled or partly rejected one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.hostile_side_files import small_job

from fr_otel.common.ports import unused_tcp_port

CLI = [sys.executable, "-m", "fr_otel.cli"]


def _can_mount() -> str | None:
    """Why a private 4 KiB tmpfs cannot be made here (None when it can): it needs root and unshare."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "a full --out is a 4 KiB tmpfs in a private mount namespace: needs root and unshare"
    probe = subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                           capture_output=True, text=True, timeout=10)
    return None if probe.returncode == 0 else f"cannot mount a tmpfs here: {probe.stderr.strip()}"


pytestmark = pytest.mark.skipif(_can_mount() is not None, reason=str(_can_mount()))


def on_full_disk(out: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run fr-otel with ``out`` a 4 KiB tmpfs (a full disk for any trace), in its own mount namespace."""
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FR_OTEL_"))}
    script = 'mount -t tmpfs -o size=4k tmpfs "$1" && shift && exec "$@"'
    return subprocess.run(["unshare", "--mount", "sh", "-c", script, "sh", str(out), *CLI, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_an_embedded_trace_that_cannot_be_written_exits_4(tmp_path: Path) -> None:
    """No endpoint, a full --out: the trace is nowhere; exit 4 and one line saying it is lost and why."""
    folder = small_job(tmp_path / "dumps")
    result = on_full_disk(tmp_path / "out", "export", str(folder), "--out", str(tmp_path / "out"))
    assert result.returncode == 4, result.stdout + result.stderr
    assert "lost" in result.stderr and "No space left on device" in result.stderr


def test_a_collector_down_and_a_full_spool_folder_exits_4(tmp_path: Path) -> None:
    """The collector refuses connections and the spool cannot be written: lost (4), not spooled (3)."""
    folder = small_job(tmp_path / "dumps")
    result = on_full_disk(tmp_path / "out", "export", str(folder), "--out", str(tmp_path / "out"), "--endpoint",
                          f"127.0.0.1:{unused_tcp_port()}", "--insecure", "--timeout", "1")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "spans lost" in result.stderr


def test_a_collector_down_with_room_to_spool_still_exits_3(tmp_path: Path) -> None:
    """The same failure with a writable --out is spooled for replay: exit 3, as before."""
    folder = small_job(tmp_path / "dumps")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FR_OTEL_"))}
    result = subprocess.run([*CLI, "export", str(folder), "--out", str(tmp_path / "out"), "--endpoint",
                             f"127.0.0.1:{unused_tcp_port()}", "--insecure", "--timeout", "1"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 3, result.stderr
    assert list((tmp_path / "out").glob("fr-otel-spool-*.jsonl"))


def test_watch_once_with_a_full_out_exits_4(tmp_path: Path) -> None:
    """`watch --once` exits as export does: its incident's trace is lost, 4."""
    folder = small_job(tmp_path / "dumps")
    result = on_full_disk(tmp_path / "out", "watch", str(folder), "--once", "--settle", "0", "--deadline", "0",
                          "--poll", "0.1", "--out", str(tmp_path / "out"))
    assert result.returncode == 4, result.stdout + result.stderr


def test_help_lists_every_exit_status(run_cli) -> None:
    """`fr-otel --help` says what 0, 1, 2, 3 and 4 mean."""
    text = " ".join(run_cli("--help").stdout.split())
    for words in ("0 done", "2 no usable dump", "3 the trace is spooled", "4 the trace is lost"):
        assert words in text, text
