"""The watcher facing a hostile state file: a FIFO, a failed incident, wrong-typed fields; never a failing poll."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.hostile_dumps import CLI


def test_watch_with_a_fifo_state_file_starts_and_sigterm_stops_it(job_folder: Path, tmp_path: Path) -> None:
    """A FIFO as state file costs a line (no block); SIGTERM ends the watcher promptly."""
    fifo = tmp_path / "state"
    os.mkfifo(fifo)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FR_OTEL_"))}
    proc = subprocess.Popen([*CLI, "watch", str(job_folder), "--state", str(fifo), "--out", str(tmp_path / "o"),
                             "--settle", "0", "--deadline", "0"], stderr=subprocess.PIPE, text=True, env=base)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not list((tmp_path / "o").glob("*.jsonl")):
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=15)
    finally:
        proc.kill()
    err = proc.stderr.read() if proc.stderr else ""
    assert rc == 0 and "not a regular file" in err and list((tmp_path / "o").glob("*.jsonl")), err
    assert fifo.is_fifo()


def test_watch_retries_an_incident_whose_analysis_failed_after_a_restart(job_folder: Path, tmp_path: Path) -> None:
    """An incident recorded as an analysis error is not "done": a restarted watcher exports it."""
    from fr_otel.otlp.config import ExportConfig
    from fr_otel.watch import DumpWatcher, WatchSettings

    files = [[p.name, p.stat().st_mtime_ns, p.stat().st_size] for p in sorted(job_folder.iterdir())]
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"version": 1, "incidents": [
        {"number": 1, "key": "k", "status": "error", "destination": "analysis failed: boom", "files": files}]}))
    settings = WatchSettings(directory=job_folder, settle_s=0, deadline_s=0, state_path=state,
                             out_dir=str(tmp_path / "o"))
    watcher = DumpWatcher(settings, ExportConfig())
    incident = None
    for _ in range(5):
        incident = watcher.poll() or incident
    assert incident is not None and incident.ok and incident.number == 2


def test_wrong_typed_state_fields_start_afresh_and_keep_a_copy(job_folder: Path, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Valid JSON with wrong types (a string number, a non-list of files) is one line, not a failing poll."""
    from fr_otel.otlp.config import ExportConfig
    from fr_otel.watch import DumpWatcher, WatchSettings

    caplog.set_level(logging.INFO, logger="fr_otel.watch")
    state = tmp_path / "state.json"
    bad = json.dumps({"incidents": [{"number": "1", "key": 5, "files": [["a", "b", "c"]]}]})
    state.write_text(bad)
    watcher = DumpWatcher(WatchSettings(directory=job_folder, settle_s=0, deadline_s=0, state_path=state,
                                        out_dir=str(tmp_path / "o")), ExportConfig())
    assert [r.getMessage() for r in caplog.records if "invalid state" in r.getMessage()].__len__() == 1
    assert (tmp_path / "state.json.bad").read_text() == bad
    incident = None
    for _ in range(5):
        incident = watcher.poll() or incident
    assert incident is not None and incident.ok
