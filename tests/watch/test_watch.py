"""``fr-otel watch``: real dumps arriving one by one, a real watcher process, real OTLP receivers.

The dumps are the real 16-rank NCCL incident lock_gil_1st (culprits 9 and 14), renamed to NCCL's
``nccl_trace_rank_<r>`` and written the way ``DebugInfoWriter`` does: straight to the final
name, here in two halves with a pause, so a reader can catch a half-written file.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fr_otel.otlp.config import ExportConfig
from fr_otel.trace.spans import TraceOptions
from fr_otel.testing.otlp import OtlpGrpcReceiver, OtlpHttpReceiver, wait_for
from fr_otel.common.ports import unused_tcp_port
from fr_otel.watch import (
    STATE_NAME,
    DumpWatcher,
    WatchSettings,
    dump_location,
    parse_rank_set,
)

INCIDENT = "lock_gil_1st"
CULPRITS = [9, 14]
WORLD = 16


@pytest.fixture(scope="module")
def dumps(nvrx: Path) -> dict[int, bytes]:
    """Each rank's real dump, by rank."""
    return {r: (nvrx / INCIDENT / f"_dump_{r}").read_bytes() for r in range(WORLD)}


def write_like_nccl(folder: Path, rank: int, data: bytes, pause: float = 0.0) -> None:
    """Write the final name directly, in two halves (NCCL opens the final name and writes)."""
    with open(folder / f"nccl_trace_rank_{rank}", "wb") as fh:
        fh.write(data[: len(data) // 2])
        fh.flush()
        time.sleep(pause)
        fh.write(data[len(data) // 2:])


def root_span(rx: Any) -> dict[str, Any]:
    roots = [s.attributes for s in rx.spans() if s.attributes.get("fr_otel.span") == "incident"]
    assert len(roots) == 1, roots
    return roots[0]


class WatchProcess:
    """A real ``fr-otel watch`` subprocess whose stderr lines can be waited for."""

    def __init__(self, tmp: Path, folder: Path, *args: str) -> None:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OTEL_", "FR_OTEL_", "TORCHELASTIC_", "SLURM_", "TORCH_FR_", "TORCH_NCCL_"))}
        self.log_path = tmp / f"watch-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "fr_otel.cli", "watch", str(folder), *args],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=tmp)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 15.0) -> None:
        ok = wait_for(lambda: text in self.log or self.proc.poll() is not None, timeout, 0.02)
        assert ok and text in self.log, f"{text!r} not logged; log:\n{self.log}"

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, as a scheduler would; the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def __enter__(self) -> WatchProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


FAST = ("--settle", "0.4", "--poll", "0.05")


def test_one_trace_after_the_last_rank_and_none_after_a_restart(dumps: dict[int, bytes], tmp_path: Path) -> None:
    """Ranks arrive one by one; exactly one trace, sent once all 16 are in; a restarted watcher sends nothing."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    order = list(range(WORLD))
    random.Random(7).shuffle(order)
    with OtlpGrpcReceiver() as rx:
        args = (*FAST, "--deadline", "30", "--endpoint", rx.url)
        with WatchProcess(tmp_path, folder, *args) as watcher:
            watcher.wait_log("watching")
            for rank in order[:-1]:
                write_like_nccl(folder, rank, dumps[rank], pause=0.1)  # the half is never settled
            watcher.wait_log(f"{WORLD - 1}/{WORLD} ranks in")
            time.sleep(0.3)
            assert rx.span_count() == 0, "exported before the last rank was in"
            write_like_nccl(folder, order[-1], dumps[order[-1]], pause=0.1)
            watcher.wait_log(" sent to ")
            time.sleep(0.5)  # nothing more may come
            assert len(rx.trace_ids()) == 1
            root = root_span(rx)
            assert root["fr_otel.culprit_ranks"] == CULPRITS
            assert root["fr_otel.ranks_loaded"] == WORLD and root["fr_otel.verdict"] == "hang"
            assert watcher.log.count(" sent to ") == 1
            assert "truncated" not in watcher.log
            assert watcher.stop() == 0
        sent = rx.span_count()
        (trace_id,) = rx.trace_ids()
        state = json.loads((folder / STATE_NAME).read_text())
        assert [(i["number"], i["trace_id"], i["status"]) for i in state["incidents"]] == [(1, trace_id, "sent")]

        with WatchProcess(tmp_path, folder, *args) as again:
            again.wait_log(f"{WORLD} dump file(s) already exported (last: incident 1)")
            time.sleep(1.0)  # settle + many polls
            assert rx.span_count() == sent
            assert again.stop() == 0
    # The identity beside the dumps: exporting the folder later gives the watcher's trace id.
    identity = json.loads((folder / "incident.json").read_text())
    assert (identity["trace_id"], identity["incident"]) == (trace_id, "watch-1")
    assert identity["summary"]["culprits"][0]["rank"] == CULPRITS[0] and (folder / "incident.html").is_file()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FR_OTEL_", "TORCHELASTIC_", "SLURM_"))}
    out = subprocess.run([sys.executable, "-m", "fr_otel.cli", "export", str(folder), "--out", str(tmp_path / "x"),
                          "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["trace_id"] == trace_id


def test_deadline_exports_what_is_in_and_names_the_missing(dumps: dict[int, bytes], tmp_path: Path) -> None:
    """Ranks 3 and 7 never arrive (3 leaves garbage): after the deadline the 14 are exported, 3 and 7 named."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    with OtlpHttpReceiver() as rx:
        args = (*FAST, "--deadline", "2", "--once", "--protocol", "http/protobuf", "--endpoint", rx.url)
        with WatchProcess(tmp_path, folder, *args) as watcher:
            (folder / "nccl_trace_rank_3").write_bytes(b"\x80\x04garbage, not a dump")
            started = time.monotonic()
            for rank in sorted(set(range(WORLD)) - {3, 7}):
                write_like_nccl(folder, rank, dumps[rank])
            assert watcher.proc.wait(20) == 0, watcher.log
            assert time.monotonic() - started >= 2.0
        root = root_span(rx)
        kinds = dict(zip(root["fr_otel.culprit_ranks"], root["fr_otel.culprit_kinds"]))
        assert kinds == {9: "not_enqueued", 14: "not_enqueued", 3: "missing_dump", 7: "missing_dump"}
        assert root["fr_otel.ranks_loaded"] == WORLD - 2
        problems = root["fr_otel.problems"]
        assert any("no dump for rank(s) 3,7 of 16" in p for p in problems), problems
        assert any("nccl_trace_rank_3" in p and "truncated or corrupt pickle" in p for p in problems), problems
        assert "deadline (2s) passed with 14 ranks in, missing 3,7" in watcher.log
        assert watcher.log.count("rank 3: ") == 1  # the garbage file: one line, once


def test_collector_down_spools_and_keeps_watching(dumps: dict[int, bytes], tmp_path: Path) -> None:
    """Nothing listens: the trace is spooled, garbage is shrugged off, overwritten dumps are a new
    incident, and SIGTERM during that export still ends with it spooled and exit 0."""
    folder, out = tmp_path / "dumps", tmp_path / "out"
    folder.mkdir()
    down = f"http://127.0.0.1:{unused_tcp_port()}"
    args = (*FAST, "--deadline", "30", "--endpoint", down, "--timeout", "1.5", "--out", str(out))
    with WatchProcess(tmp_path, folder, *args) as watcher:
        for rank in range(WORLD):
            write_like_nccl(folder, rank, dumps[rank])
        watcher.wait_log("spooled to")
        assert watcher.proc.poll() is None
        assert len(list(out.glob("*.jsonl"))) == 1
        (folder / "nccl_trace_rank_42").write_bytes(os.urandom(3000))
        (folder / "nccl_trace_rank_43").write_bytes(b"")
        (folder / "nccl_trace_rank_44").mkdir()
        watcher.wait_log("rank 43: ")
        watcher.wait_log("rank 42: ")
        assert watcher.proc.poll() is None

        for rank in range(WORLD):  # the job restarted and hung again: the files are overwritten
            write_like_nccl(folder, rank, dumps[rank])
        watcher.wait_log("incident 2 complete")
        assert watcher.stop() == 0  # mid-export: it finishes (bounded by --timeout), then exits
        assert "incident 2: hang, culprit ranks 9,14" in watcher.log and "stopping (SIGTERM)" in watcher.log
    state = json.loads((folder / STATE_NAME).read_text())["incidents"]
    assert [(i["number"], i["status"]) for i in state] == [(1, "spooled"), (2, "spooled")]
    assert state[0]["trace_id"] != state[1]["trace_id"]
    assert {p.name for p in out.glob("*.jsonl")} == {f"{Path(i['spool_path']).name}" for i in state}


# --- the watcher's logic, in process with a hand-turned clock -------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.base = time.time()

    def wall(self) -> float:
        return self.base + self.t

    def mono(self) -> float:
        return self.t


def make_watcher(folder: Path, tmp: Path, clock: Clock, **kwargs: Any) -> DumpWatcher:
    settings = WatchSettings(folder, settle_s=0.5, deadline_s=kwargs.pop("deadline_s", 60.0),
                             out_dir=str(tmp / "out"), **kwargs)
    return DumpWatcher(settings, ExportConfig(), TraceOptions(job_id="job-A"), wall=clock.wall,
                       monotonic=clock.mono)


def step(watcher: DumpWatcher, clock: Clock, dt: float = 1.0) -> Any:
    clock.t += dt
    return watcher.poll()


def test_truncated_dump_waits_and_is_reported_once(dumps: dict[int, bytes], tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A writer that stalls past the settle time: reported once, never analysed, picked up once whole."""
    caplog.set_level(logging.INFO, logger="fr_otel.watch")
    folder = tmp_path / "dumps"
    folder.mkdir()
    for rank in range(WORLD):
        if rank != 9:
            write_like_nccl(folder, rank, dumps[rank])
    half = dumps[9][: len(dumps[9]) // 2]
    (folder / "nccl_trace_rank_9").write_bytes(half)
    clock = Clock()
    watcher = make_watcher(folder, tmp_path, clock)
    assert watcher.poll() is None  # first sight: everything is settling
    assert step(watcher, clock) is None and step(watcher, clock) is None
    assert caplog.text.count("nccl_trace_rank_9: truncated or corrupt pickle") == 1
    with open(folder / "nccl_trace_rank_9", "ab") as fh:
        fh.write(dumps[9][len(half):])
    assert step(watcher, clock, 0.1) is None  # it changed: settling again
    incident = step(watcher, clock)
    assert incident is not None and incident.reason == "complete" and incident.ok
    assert (incident.culprits, incident.ranks, incident.missing) == (CULPRITS, list(range(WORLD)), [])


def test_each_incident_once_across_restarts_rewrites_and_late_ranks(dumps: dict[int, bytes], tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    folder.mkdir()
    for rank in range(WORLD):
        if rank not in (3, 7):
            write_like_nccl(folder, rank, dumps[rank])
    clock = Clock()
    watcher = make_watcher(folder, tmp_path, clock, deadline_s=5.0)
    first = None
    for _ in range(8):
        first = first or step(watcher, clock)
    assert first is not None and (first.number, first.reason, first.missing) == (1, "deadline", [3, 7])

    for rank in (3, 7):  # stragglers of incident 1: remembered, not a second incident
        write_like_nccl(folder, rank, dumps[rank])
    assert [step(watcher, clock) for _ in range(8)] == [None] * 8
    assert [(i.number, i.late_ranks) for i in watcher.incidents] == [(1, [3, 7])]

    restarted = make_watcher(folder, tmp_path, clock, deadline_s=5.0)
    assert [step(restarted, clock) for _ in range(8)] == [None] * 8

    for rank in range(WORLD):  # the job restarts and hangs again: the files are overwritten
        write_like_nccl(folder, rank, dumps[rank])
    second = None
    for _ in range(3):
        second = second or step(restarted, clock)
    assert second is not None and (second.number, second.reason, second.culprits) == (2, "complete", CULPRITS)
    assert second.trace_id != first.trace_id

    # A watcher killed mid-export (state says "exporting") re-exports under the same number and trace id.
    state_path = folder / STATE_NAME
    state = json.loads(state_path.read_text())
    state["incidents"][-1]["status"] = "exporting"
    state_path.write_text(json.dumps(state))
    again = make_watcher(folder, tmp_path, clock)
    third = None
    for _ in range(3):
        third = third or step(again, clock)
    assert third is not None and (third.number, third.trace_id) == (2, second.trace_id)


def test_dump_location_and_rank_sets(tmp_path: Path) -> None:
    env = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/old/nccl_trace_rank_"}
    assert dump_location(None, None, env) == (Path("/old"), "nccl_trace_rank_")
    env["TORCH_FR_DUMP_TEMP_FILE"] = f"{tmp_path}/fr_"
    assert dump_location(None, None, env) == (tmp_path, "fr_")
    assert dump_location(tmp_path, None, env) == (tmp_path, "fr_")  # same folder: same prefix
    assert dump_location(tmp_path / "x", None, env) == (tmp_path / "x", None)
    assert dump_location(None, "p_", {}) == (Path("~/.cache/torch").expanduser(), "p_")
    assert parse_rank_set("0-3, 8,16-17") == frozenset({0, 1, 2, 3, 8, 16, 17})
    for bad in ("", "3-1", "a", "-2"):
        with pytest.raises(ValueError):
            parse_rank_set(bad)


def test_unreadable_state_is_not_fatal(dumps: dict[int, bytes], tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    """A damaged state file costs a log line and a re-export, never the watcher."""
    caplog.set_level(logging.INFO, logger="fr_otel.watch")
    folder = tmp_path / "dumps"
    folder.mkdir()
    for rank in range(WORLD):
        write_like_nccl(folder, rank, dumps[rank])
    (folder / STATE_NAME).write_text('{"incidents": [{"number": 1, "files": 5}]}')
    clock = Clock()
    watcher = make_watcher(folder, tmp_path, clock)
    assert "invalid state" in caplog.text and "kept as" in caplog.text
    assert (folder / f"{STATE_NAME}.bad").read_text() == '{"incidents": [{"number": 1, "files": 5}]}'
    incident = watcher.poll() or step(watcher, clock)
    assert incident is not None and incident.number == 1 and incident.ok
    assert json.loads((folder / STATE_NAME).read_text())["incidents"][0]["trace_id"] == incident.trace_id
