"""Issue 11's reproductions, one regression test each: hostile dumps, outputs, endpoints, receivers, state."""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fr_otel import analyze, build_job, read_dumps
from fr_otel.report.html import render
from fr_otel.otlp.config import resolve_export_config
from fr_otel.otlp.chunks import to_requests
from fr_otel.trace.spans import build_trace
from fr_otel.testing.dump_builder import DumpBuilder
from fr_otel.testing.otlp import OtlpGrpcReceiver, OtlpHttpReceiver
from fr_otel.report.text import render_verdict
from hostile_dumps import STUCK, VICTIM, WORLD, nccl_dump

CLI = [sys.executable, "-m", "fr_otel.cli"]


def write_job(folder: Path, victim: dict[str, Any] | None = None, *, fmt: str = "pickle",
              name: str | bytes | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(WORLD):
        doc = victim if rank == VICTIM and victim is not None else nccl_dump(rank)
        data = pickle.dumps(doc) if fmt == "pickle" else json.dumps(doc).encode()
        file = f"rank_{rank}" + (".json" if fmt == "json" else "")
        if rank == VICTIM and name is not None:
            path = os.path.join(os.fsencode(folder), name) if isinstance(name, bytes) else str(folder / name)
            with open(path, "wb") as fh:
                fh.write(data)
        else:
            (folder / file).write_bytes(data)
    return folder


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FR_OTEL_"))}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})},
                          errors="backslashreplace")


def victim_with(**fields: Any) -> dict[str, Any]:
    """The victim rank's dump with these fields set in its last entry."""
    doc = nccl_dump(VICTIM)
    doc["entries"][-1].update(fields)
    return doc


def everything(folder: Path) -> tuple[Any, Any, list[str]]:
    read = read_dumps(folder)
    job = build_job(read)
    verdict = analyze(job)
    render_verdict(verdict)
    render(job, verdict)
    to_requests(build_trace(job, verdict).spans)
    return job, verdict, read.problems


# --------------------------------------------------------------------------- 1. validation at the boundary


@pytest.mark.parametrize(("field", "value", "words"), [
    ("input_dtypes", [None], "'input_dtypes' is list [None], not a list of at most 4096 strings"),
    ("timeout_ms", "30000", "'timeout_ms' is str '30000'"),
    ("duration_ms", "1.5ms", "'duration_ms' is str '1.5ms'"),
    ("time_discovered_completed_ns", "late", "'time_discovered_completed_ns' is str 'late'"),
    ("record_id", [7], "'record_id' is list [7]"),
    ("record_id", 2**63, "'record_id' is int 9223372036854775808, not a 64-bit integer"),
    ("op_id", 2**64, "'op_id' is int"),
    ("timeout_ms", 2**63, "'timeout_ms' is int"),
    ("time_discovered_started_ns", 10**400, "'time_discovered_started_ns' is int 1000000"),
])
def test_a_wrong_typed_optional_field_is_read_as_unknown_with_one_line(
    tmp_path: Path, field: str, value: Any, words: str
) -> None:
    """Analyze, report and export all work; one line names the file, the entry and the field.

    (Unreadable dtypes or sizes are a real disagreement with the other ranks' records, so the
    victim may be named for a mismatch too; the stuck rank is always found.)"""
    job, verdict, problems = everything(write_job(tmp_path, victim_with(**{field: value})))
    culprits = [c.rank for c in verdict.culprits]
    assert VICTIM in job.dumps and (culprits == [STUCK] or field.endswith(("_dtypes", "_sizes")) and STUCK in culprits)
    hits = [p for p in problems if f"rank_{VICTIM}" in p]
    assert len(hits) == 1 and words in hits[0] and "entry 5" in hits[0] and "read as unknown" in hits[0], hits


@pytest.mark.parametrize(("field", "value"), [
    ("time_created_ns", -1), ("time_created_ns", "1700000000"), ("collective_seq_id", 2**63),
    ("collective_seq_id", True), ("process_group", "0"), ("profiling_name", None),
])
def test_a_bad_required_field_drops_that_entry_not_the_rank(tmp_path: Path, field: str, value: Any) -> None:
    """The entry goes (one line naming it), the rank stays; ``True`` is not sequence number 1."""
    doc = nccl_dump(VICTIM)
    doc["entries"][2][field] = value
    job, verdict, problems = everything(write_job(tmp_path, doc))
    assert VICTIM in job.dumps and job.dumps[VICTIM].entry_count == len(doc["entries"]) - 1
    assert [p for p in problems if f"rank_{VICTIM}" in p] == [
        next(p for p in problems if "1 malformed entry skipped (first: entry 2:" in p and field in p)]
    assert not any(c.rank == 0 and c.kind == "desync" for c in verdict.culprits)


def test_a_401_digit_time_does_not_break_the_text_report(tmp_path: Path) -> None:
    """Huge integers never reach arithmetic: the entry is dropped, the report renders."""
    doc = nccl_dump(VICTIM)
    doc["entries"][-1]["time_created_ns"] = 10**400
    doc["pg_status"]["0"]["last_enqueued_collective"] = 10**400
    job, verdict, problems = everything(write_job(tmp_path, doc))
    assert "malformed 'pg_status'" in " ".join(problems)


def test_json_dump_with_wrong_types_is_read_like_the_pickle(tmp_path: Path) -> None:
    """JSON's own shapes (lists for tuples, strings for counters) stay fine; wrong ones are repaired."""
    job, verdict, problems = everything(write_job(tmp_path, victim_with(timeout_ms="30000"), fmt="json"))
    assert [c.rank for c in verdict.culprits] == [STUCK]
    assert len([p for p in problems if "'timeout_ms'" in p]) == 1


def test_hostile_text_is_escaped_and_encodes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Lone surrogates and control characters in names, a non-UTF-8 file name, ints over 2**63 in
    record_id/op_id/timeout/frame line: every attribute survives encoding, nothing is logged, and
    fr_otel.problems (with "no dump for rank") is still on the root span."""
    doc = victim_with(thread_name="\ud800\x1b[2J", record_id=2**63, op_id=2**64, timeout_ms=2**65,
                      frames=[{"name": "f\udcff", "filename": "x.py", "line": 2**70}])
    folder = write_job(tmp_path / "d", doc, name=b"rank_\xff\x1b[2J_1")
    (folder / f"rank_{STUCK}").unlink()  # one rank has no dump at all
    caplog.set_level(logging.WARNING)
    job, verdict, problems = everything(folder)
    trace = build_trace(job, verdict)
    requests = to_requests(trace.spans)
    root = next(s for r in requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans
                if s.name == "fr_otel.incident")
    values = {a.key: a.value for a in root.attributes}
    listed = [v.string_value for v in values["fr_otel.problems"].array_value.values]
    assert any("\\xff\\x1b[2J_1" in p for p in listed), listed
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "opentelemetry" in r.name]
    entry_attrs = [{a.key: a.value for a in s.attributes} for r in requests for rs in r.resource_spans
                   for ss in rs.scope_spans for s in ss.spans]
    entry_attrs = [a for a in entry_attrs if a["fr_otel.span"].string_value == "entry"]
    assert entry_attrs and all("thread.name" in a for a in entry_attrs)
    assert "\\ud800\\x1b[2J" in {a["thread.name"].string_value for a in entry_attrs}


@pytest.mark.parametrize("odd", ["\ud7fc", "\u200b", "\u00a0", "\U000e0001", "\u0600"])
def test_unassigned_and_format_characters_in_a_version_are_escaped_in_the_text_report(
        tmp_path: Path, odd: str) -> None:
    """An unassigned code point, a zero-width space, a no-break space, a tag character or an
    Arabic number sign in the dump's version reaches the text report escaped: the verdict shows
    only characters a terminal prints as themselves (Hypothesis found U+D7FC getting through)."""
    doc = nccl_dump(VICTIM)
    doc["version"] = f"2.{odd}10"
    folder = write_job(tmp_path / "d", doc)
    job, verdict, _ = everything(folder)
    text = render_verdict(verdict)
    assert all(c.isprintable() or c == "\n" for c in text), repr(text)
    escaped = f"\\u{ord(odd):04x}" if ord(odd) < 0x10000 else f"\\U{ord(odd):08x}"
    if ord(odd) < 0x100:
        escaped = f"\\x{ord(odd):02x}"
    assert f"2.{escaped}10" in text, repr(text)  # shown, escaped: not dropped


def test_control_characters_in_file_names_do_not_reach_the_terminal(tmp_path: Path) -> None:
    """A newline in a file name cannot forge a line; ESC[2J cannot clear the screen."""
    bad = victim_with(input_dtypes=[None])
    write_job(tmp_path, bad, name="x\nfr-otel: HEALTHY\x1b[2J_1")
    proc = cli("analyze", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "\x1b" not in out and "\nfr-otel: HEALTHY" not in out and "x\\x0afr-otel: HEALTHY\\x1b[2J_1" in out


# --------------------------------------------------------------------------- 2. bounded resources


def _peak_rss_mib(*args: str) -> tuple[int, float, subprocess.CompletedProcess[str]]:
    """Run the CLI in a fresh interpreter; its own peak RSS (MiB) and wall time.

    VmHWM, not ``ru_maxrss``: the latter keeps the forked parent's peak across exec."""
    code = ("import sys; from fr_otel.cli import main; rc = main(sys.argv[1:]); "
            "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]; "
            "sys.stderr.write(f'\\nPEAK {hwm}\\n'); sys.exit(rc)")
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    peak = int(proc.stderr.rsplit("PEAK ", 1)[1].split()[0]) // 1024
    return peak, time.monotonic() - began, proc


def test_a_15_byte_memo_bomb_stays_under_256_mib(tmp_path: Path) -> None:
    """LONG_BINPUT to memo slot 2**27 would make the unpickler zero 2 GiB: refused in one line."""
    bomb = b"\x80\x02N" + b"r" + struct.pack("<I", 2**27) + b"." + b"\x00" * 6
    assert len(bomb) == 15
    write_job(tmp_path)
    (tmp_path / f"rank_{VICTIM}").write_bytes(bomb)
    peak, _, proc = _peak_rss_mib("analyze", str(tmp_path))
    assert proc.returncode == 0 and peak < 256, (peak, proc.stderr)
    assert f"rank_{VICTIM}: truncated or corrupt pickle: it asks for far more memory" in proc.stdout


@pytest.mark.parametrize("head", [b"{", b"\x80\x04\x8d"])
def test_a_2_gib_hostile_file_is_refused_quickly(tmp_path: Path, head: bytes) -> None:
    """A sparse 2 GiB file starting like JSON or with a BINUNICODE8 header: refused by the size cap."""
    write_job(tmp_path)
    with open(tmp_path / f"rank_{VICTIM}", "wb") as fh:
        fh.write(head + struct.pack("<Q", 2**31) if head.startswith(b"\x80") else head)
        fh.truncate(2 << 30)
    peak, seconds, proc = _peak_rss_mib("analyze", str(tmp_path))
    assert proc.returncode == 0 and peak < 1024 and seconds < 20, (peak, seconds, proc.stderr)
    assert "2147483648 bytes, over the 1073741824-byte limit per dump (--max-file-size); skipped" in proc.stdout


def test_a_small_file_claiming_a_2_gib_string_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """Under the size cap, a BINUNICODE8 header asking for 2 GiB costs a line, not 2 GiB."""
    write_job(tmp_path)
    (tmp_path / f"rank_{VICTIM}").write_bytes(b"\x80\x04\x8d" + struct.pack("<Q", 2**31) + b"abc")
    peak, _, proc = _peak_rss_mib("analyze", str(tmp_path), "--max-file-size", "4G")
    assert proc.returncode == 0 and peak < 256, (peak, proc.stderr)
    assert f"rank_{VICTIM}: truncated or corrupt pickle" in proc.stdout


def test_the_size_cap_is_a_flag(tmp_path: Path) -> None:
    """--max-file-size lowers the cap; a bad value is a usage error."""
    write_job(tmp_path)
    proc = cli("analyze", str(tmp_path), "--max-file-size", "1k")
    assert proc.returncode == 2 and "no usable Flight Recorder dump" in proc.stderr
    assert cli("analyze", str(tmp_path), "--max-file-size", "lots").returncode == 2


def test_huge_list_attributes_are_clipped_before_encoding(tmp_path: Path) -> None:
    """A 1 MB input_dtypes string in 6 entries: export stays fast and small."""
    doc = nccl_dump(VICTIM)
    for e in doc["entries"]:
        e["input_dtypes"] = ["F" * 1_000_000] * 3
        e["input_sizes"] = [[1] * 50_000]
    began = time.monotonic()
    job, verdict, _ = everything(write_job(tmp_path, doc))
    requests = to_requests(build_trace(job, verdict).spans)
    assert sum(r.ByteSize() for r in requests) < 512 << 10 and time.monotonic() - began < 10


# --------------------------------------------------------------------------- 3. safe outputs


@pytest.fixture
def job_folder(tmp_path: Path) -> Path:
    return write_job(tmp_path / "dumps")


@pytest.mark.parametrize("kind", ["fifo", "device", "dir"])
def test_report_to_a_fifo_device_or_directory_exits_2_and_leaves_it(job_folder: Path, tmp_path: Path,
                                                                    kind: str) -> None:
    """-o must be a regular file: a FIFO, a device or a directory is refused untouched."""
    if kind == "fifo":
        target = tmp_path / "fifo"
        os.mkfifo(target)
    elif kind == "device":
        target = Path("/dev/null")
    else:
        target = tmp_path / "dir"
        target.mkdir()
    before = os.stat(target)
    proc = cli("report", str(job_folder), "-o", str(target), timeout=30)
    assert proc.returncode == 2 and "not a regular file; refusing to write there" in proc.stderr
    after = os.stat(target)
    assert (before.st_mode, before.st_ino, before.st_rdev) == (after.st_mode, after.st_ino, after.st_rdev)


def test_html_and_out_are_checked_before_reading(job_folder: Path, tmp_path: Path) -> None:
    """analyze --html FIFO and export --out FILE are refused (exit 2) before any work."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = cli("analyze", str(job_folder), "--html", str(fifo), timeout=30)
    assert proc.returncode == 2 and "FIFO" in proc.stderr
    plain = tmp_path / "plain"
    plain.write_text("keep")
    proc = cli("export", str(job_folder), "--out", str(plain), timeout=30)
    assert proc.returncode == 2 and "not a directory" in proc.stderr and plain.read_text() == "keep"


def test_report_through_a_symlink_replaces_its_target_atomically(job_folder: Path, tmp_path: Path) -> None:
    """A symlink stays a symlink; its regular target gets the new page (no temp file left)."""
    target = tmp_path / "real.html"
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    proc = cli("report", str(job_folder), "-o", str(link))
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and target.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


# A write in product code: a private temp-and-rename, Path.write_text/write_bytes, open() with a
# writing mode, or os.open with a writing flag. Reads are fine.
_PLAIN_WRITE = re.compile(
    r"mkstemp\(|os\.replace\(\s*tmp|\.part\{"
    r"|\.write_(?:text|bytes)\("
    r"|\bopen\((?:[^()]|\([^()]*\))*?,\s*(?:mode\s*=\s*)?[rbf]*[\"'][rbt]*[wax+]"
    r"|\.open\(\s*(?:mode\s*=\s*)?[\"'][rbt]*[wax+]"
    r"|\bos\.open\((?:[^()]|\([^()]*\))*?O_(?:WRONLY|RDWR|CREAT|APPEND)"
)
# What must not be atomic, by (file, text on the line), each with its reason.
_NOT_ATOMIC = {
    ("otlp/jsonl.py", "os.O_APPEND"):
        "--jsonl appends one line per request to a file that may already hold earlier exports",
    ("testing/prometheus.py", '"prometheus.log", "wb"'):
        "Prometheus' own log, streamed by the child process while it runs",
    ("demo/job.py", 'open(plan.log, "wb")'):
        "the demo job's output (torchrun and the agents' lines), streamed by the child processes while they run",
    ("testing/train_loop.py", ".write_text("):
        "torchrun payload script that never imports fr_otel; its marker files are polled by tests",
    ("testing/train_loop.py", "os.replace(tmp"):
        "the same script's markers, each renamed into place so a polling test never reads half of one",
}


def _plain_writes(text: str) -> list[str]:
    """Each line of ``text`` that writes a file without fr_otel.common.files."""
    lines = text.splitlines()
    return [lines[text.count("\n", 0, m.start())].strip() for m in _PLAIN_WRITE.finditer(text)]


def test_one_atomic_writer_for_the_project() -> None:
    """Every file fr-otel writes goes through fr_otel.common.files.atomic_write, but the listed streams."""
    src = Path(__file__).resolve().parents[1] / "src" / "fr_otel"
    offenders = [
        f"{name}: {line}"
        for path in sorted(src.rglob("*.py"))
        if (name := path.relative_to(src).as_posix()) != "common/files.py"
        for line in _plain_writes(path.read_text(encoding="utf-8"))
        if not any(name == where and what in line for where, what in _NOT_ATOMIC)
    ]
    assert offenders == []


@pytest.mark.parametrize("code", [
    'Path(p).write_text("x")', "p.write_bytes(b)", 'open(p, "w")', 'open(p, "ab")', 'p.open("r+")',
    'open(p, mode="wb")', "open(os.path.join(a, b), 'x')", "os.open(p, os.O_WRONLY | os.O_CREAT)",
    'open(\n    p,\n    "w",\n)', "tempfile.mkstemp(dir=d)",
])
def test_the_atomic_writer_check_catches_each_plain_write(code: str) -> None:
    """The check above is not blind: every way to write a file is reported."""
    assert _plain_writes(code)


@pytest.mark.parametrize("code", [
    'open(p, "rb")', "open(p)", 'p.open("r", encoding="utf-8")', "open(fd, 'rb')",
    "os.open(p, os.O_RDONLY | os.O_NONBLOCK)", 'urllib.request.urlopen(req, timeout=t)', "self.join_open()",
])
def test_the_atomic_writer_check_lets_reads_pass(code: str) -> None:
    """Reads are not writes: opening for reading is never reported."""
    assert _plain_writes(code) == []


# --------------------------------------------------------------------------- 4. partial success


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_receiver_rejecting_half_the_spans_makes_export_say_so_and_exit_3(
    job_folder: Path, tmp_path: Path, protocol: str
) -> None:
    """Partial success is not delivery: the count of rejected spans is printed, exit 3."""
    receiver = OtlpGrpcReceiver if protocol == "grpc" else OtlpHttpReceiver
    with receiver(reject_fraction=0.5) as rx:
        proc = cli("export", str(job_folder), "--endpoint", rx.url, "--protocol", protocol, "--out",
                   str(tmp_path / "out"), "--json")
        rejected = rx.rejected_spans
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    total = doc["export"]["spans"]
    assert rejected == total // 2 and doc["export"]["spans_rejected"] == rejected
    assert doc["export"]["status"] == "partial"
    assert f"only {total - rejected} of {total} spans delivered" in proc.stderr
    assert f"collector rejected {rejected} of {total} spans" in proc.stderr


def test_partial_success_over_http_json_is_counted(tmp_path: Path) -> None:
    """The OTLP/JSON body's partialSuccess is read too."""
    from fr_otel.otlp.export import export_spans
    from fr_otel.testing.spans import synthetic_spans

    with OtlpHttpReceiver(reject_fraction=0.5) as rx:
        config = resolve_export_config(endpoint=rx.url, protocol="http/json", environ={})
        result = export_spans(synthetic_spans(100), config, deadline_s=10, spool_dir=tmp_path)
    assert result.spans_rejected == 50 and result.spans_sent == 50 and not result.ok
    assert "collector rejected 50 of 100 spans" in (result.error or "")


# --------------------------------------------------------------------------- 6. endpoints, headers, TLS files


@pytest.mark.parametrize(("flags", "env", "words"), [
    (["--endpoint", "ftp://host:21"], {}, "host:port or http[s]://host:port"),
    (["--endpoint", "host:notaport"], {}, "port must be a number from 1 to 65535"),
    (["--endpoint", "host:99999"], {}, "port must be a number from 1 to 65535"),
    (["--endpoint", "not_a_url"], {}, "needs a port"),
    (["--endpoint", "http://127.0.0.1:-1"], {}, "port must be a number"),
    ([], {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:99999"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    (["--endpoint", "127.0.0.1:4317", "--headers", "auth=a%0Ab"], {}, "control characters"),
    ([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_CERTIFICATE": "@CERT@"},
     "not usable PEM"),
])
def test_bad_endpoint_settings_are_one_line_and_exit_2_before_dialling(
    job_folder: Path, tmp_path: Path, flags: list[str], env: dict[str, str], words: str
) -> None:
    """Flags and OTEL_* alike: one line, exit 2, fast (nothing was dialled or retried)."""
    cert = tmp_path / "ca.pem"
    cert.write_text("not a certificate\n")
    env = {k: v.replace("@CERT@", str(cert)) for k, v in env.items()}
    began = time.monotonic()
    proc = cli("export", str(job_folder), "--out", str(tmp_path / "out"), *flags, env=env, timeout=30)
    assert proc.returncode == 2 and time.monotonic() - began < 15, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- 5. watch state and signals


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


# --------------------------------------------------------------------------- 7. agent store back-off


def test_store_backoff_doubles_up_to_the_cap_and_speaks_once(caplog: pytest.LogCaptureFixture) -> None:
    """After 3 failures: waits 2, 4, 8 ... 60 s between tries; one line when it starts, one when it ends."""
    from fr_otel.agent.store_link import StoreBackoff

    now = [0.0]
    backoff = StoreBackoff(threshold=3, base_s=2, cap_s=60, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="fr_otel.agent")
    tries = []
    while now[0] < 600:
        if backoff.allow():
            tries.append(now[0])
            backoff.failure(ConnectionResetError("gone"))
        now[0] += 1.0
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert gaps[:6] == [1, 1, 2, 4, 8, 16] and max(gaps) == 60 and len(tries) < 20
    backoff.success()
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 2 and "backing off" in msgs[0] and "answers again" in msgs[1]


@pytest.mark.skipif(sys.modules.get("torch") is None and __import__("importlib").util.find_spec("torch") is None,
                    reason="needs torch")
def test_a_dead_store_does_not_flood_stderr(tmp_path: Path) -> None:
    """Polling a TCPStore whose server is gone, once per 0.1 s for 4 s: a few tries, not one per poll."""
    script = tmp_path / "dead_store.py"
    script.write_text(
        "import sys, time, logging\n"
        "from datetime import timedelta\n"
        "import torch.distributed as dist\n"
        "from fr_otel.agent.channel import IncidentChannel\n"
        "from fr_otel.agent.store_link import StoreUnavailable\n"
        "from fr_otel.testing.ports import unused_tcp_port\n"
        "logging.basicConfig(level=logging.WARNING, format='%(name)s: %(message)s')\n"
        "port = unused_tcp_port()\n"
        "server = dist.TCPStore('127.0.0.1', port, is_master=True, timeout=timedelta(seconds=2))\n"
        "client = dist.TCPStore('127.0.0.1', port, is_master=False, timeout=timedelta(seconds=1))\n"
        "channel = IncidentChannel(dist.PrefixStore('x/', client), 'test')\n"
        "del server\n"
        "calls = 0\n"
        "end = time.monotonic() + 4\n"
        "while time.monotonic() < end:\n"
        "    if channel.reachable():\n"
        "        calls += 1\n"
        "        try: channel.owner(1)\n"
        "        except StoreUnavailable: pass\n"
        "        except Exception: pass\n"
        "    time.sleep(0.1)\n"
        "print('CALLS', calls)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    calls = int(proc.stdout.split("CALLS")[1])
    assert calls <= 5, proc.stdout + proc.stderr[-2000:]
    assert proc.stderr.count("backing off") == 1


# --------------------------------------------------------------------------- 8. minor items


def test_replay_of_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    proc = cli("replay", str(tmp_path / "nope.jsonl"), "--endpoint", "127.0.0.1:4317")
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_a_5000_digit_json_integer_is_called_invalid_json(tmp_path: Path) -> None:
    write_job(tmp_path)
    (tmp_path / f"rank_{VICTIM}").unlink()
    (tmp_path / f"rank_{VICTIM}.json").write_text('{"version": "2.1", "entries": [], "pg_status": {"0": '
                                                  '{"last_enqueued_collective": ' + "9" * 5000 + "}}}")
    read = read_dumps(tmp_path)
    assert [p for p in read.problems if "rank_1.json" in p][0].startswith(f"{tmp_path}/rank_1.json: invalid JSON:")


def test_trailing_data_after_the_pickle_is_reported(tmp_path: Path) -> None:
    write_job(tmp_path)
    victim = tmp_path / f"rank_{VICTIM}"
    victim.write_bytes(victim.read_bytes() + pickle.dumps({"version": "2.10", "entries": []}))
    read = read_dumps(tmp_path)
    assert VICTIM in read.dumps
    assert [p for p in read.problems if "data after the end of the pickle" in p] != []


def test_fifos_devices_and_link_loops_in_a_dump_folder_are_named(tmp_path: Path) -> None:
    """Skipped, each with one line; nothing blocks on the FIFO."""
    write_job(tmp_path)
    os.mkfifo(tmp_path / "rank_7")
    (tmp_path / "rank_8").symlink_to("/dev/null")
    (tmp_path / "rank_9").symlink_to(tmp_path / "rank_9")
    read = read_dumps(tmp_path)
    for n in (7, 8, 9):
        assert len([p for p in read.problems if f"rank_{n}: not a regular file" in p]) == 1
    assert set(read.dumps) == set(range(WORLD))


def test_a_failed_spool_rewrite_counts_the_delivered_spans_still_in_it(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """If replay cannot rewrite a partly delivered file, it says those spans are still there."""
    from fr_otel.otlp import export as otlp_export
    from fr_otel.otlp.chunks import chunk_requests
    from fr_otel.otlp.jsonl import write_jsonl
    from fr_otel.testing.spans import synthetic_spans

    spool = write_jsonl(tmp_path / "spool.jsonl", chunk_requests(
        to_requests(synthetic_spans(200)), 4096))
    with OtlpGrpcReceiver() as rx:
        rx.fail_next(*([None] * 3), *([__import__("grpc").StatusCode.INVALID_ARGUMENT] * 200))

        def failing_rewrite(*args: Any, **kwargs: Any) -> Any:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(otlp_export, "write_jsonl", failing_rewrite)
        config = resolve_export_config(endpoint=rx.url, environ={}, max_request_bytes=4096)
        result = otlp_export.replay([spool], config, deadline_s=10, remove_on_success=True)
    assert result.spans_sent > 0 and result.spans_spooled == 200
    assert f"its {result.spans_sent} delivered spans" in (result.error or "")


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize(("field", "value"), [("input_dtypes", [None]), ("input_sizes", "x"),
                                              ("output_dtypes", 7), ("output_sizes", [[-1]])])
def test_an_unreadable_call_on_a_healthy_rank_is_never_blamed_as_a_mismatch(
        tmp_path: Path, fmt: str, field: str, value: object) -> None:
    """A repaired sizes/dtypes field reads as an unknown call: the healthy rank it sits on is not
    named for a mismatch, and the real culprit (rank 2, which never enqueued #6) still is."""
    b = DumpBuilder(4)
    world = b.group("0", "default_pg", range(4))
    for _ in range(5):
        b.collective(world)
    b.collective(world, ranks=[0, 1, 3], done=False)
    folder = b.write(tmp_path / fmt, fmt=fmt)
    victim = folder / "nccl_trace_rank_1"
    body = pickle.loads(victim.read_bytes()) if fmt == "pickle" else json.loads(victim.read_bytes())
    for entry in body["entries"][2:4]:  # two completed collectives of the healthy rank 1
        entry[field] = value
    victim.write_bytes(pickle.dumps(body, protocol=2) if fmt == "pickle" else json.dumps(body).encode())

    read = read_dumps(folder)
    verdict = analyze(build_job(read))
    assert any(str(victim) in p and field in p for p in read.problems)
    assert [c.rank for c in verdict.culprits] == [2] and verdict.verdict == "hang"
    assert all(c.kind != "mismatch" and all(ev.kind != "mismatch" for ev in c.related) for c in verdict.culprits)


def _self_nested(depth: int = 60) -> list:
    """A list holding itself twice, ``depth`` times: ~2 KB pickled, 2**depth elements unrolled."""
    x: Any = [4, 4]
    for _ in range(depth):
        x = [x, x]
    return x


@pytest.mark.parametrize("field", ["input_sizes", "input_dtypes", "output_sizes", "profiling_name", "frames"])
def test_a_pickle_that_nests_one_shared_list_in_itself_is_read_in_bounded_time(tmp_path: Path, field: str) -> None:
    """Memo references let 2 KB of pickle stand for 2**60 elements: the reader never unrolls them
    (the call key is marshalled with references), the field is repaired or the entry dropped with
    one line, and the other ranks are analysed, in well under a second."""
    b = DumpBuilder(4)
    world = b.group("0", "default_pg", range(4))
    for _ in range(3):
        b.collective(world)
    b.collective(world, ranks=[0, 1, 3], done=False)
    folder = b.write(tmp_path)
    victim = folder / "nccl_trace_rank_1"
    body = pickle.loads(victim.read_bytes())
    bomb = _self_nested()
    for entry in body["entries"]:
        entry[field] = bomb
    victim.write_bytes(pickle.dumps(body, protocol=2))
    assert victim.stat().st_size < 8192

    started = time.monotonic()
    read = read_dumps(folder)
    verdict = analyze(build_job(read))
    assert time.monotonic() - started < 5
    assert set(read.dumps) >= {0, 2, 3} and any(field in p for p in read.problems)
    assert 2 in [c.rank for c in verdict.culprits]


@pytest.mark.parametrize(("field", "leaf"), [("input_sizes", [4, 4]), ("input_dtypes", "Float"),
                                             ("frames", {"name": "f", "filename": "a.py", "line": 1})])
def test_a_call_or_stack_repeated_by_reference_300000_times_is_capped(tmp_path: Path, field: str, leaf: Any) -> None:
    """2000 entries sharing one list of 300,000 references (< 1 MB pickled) are read as unknown
    calls/stacks with one line naming the cap, in bounded time, not walked 600 million times."""
    b = DumpBuilder(4)
    world = b.group("0", "default_pg", range(4))
    for _ in range(3):
        b.collective(world)
    folder = b.write(tmp_path)
    victim = folder / "nccl_trace_rank_1"
    body = pickle.loads(victim.read_bytes())
    template, wide = body["entries"][0], [leaf] * 300_000
    body["entries"] = [dict(template, collective_seq_id=i + 1, record_id=i, **{field: wide}) for i in range(2000)]
    victim.write_bytes(pickle.dumps(body, protocol=2))

    started = time.monotonic()
    read = read_dumps(folder)
    analyze(build_job(read))
    assert time.monotonic() - started < 10
    assert 1 in read.dumps and any(field in p and "at most" in p for p in read.problems)


def test_an_output_in_a_missing_folder_is_one_line_and_exit_2_before_any_work(tmp_path: Path, run_cli) -> None:
    """`-o`/`--html` into a folder that does not exist: one line naming it, exit 2 (not 1)."""
    dumps = write_job(tmp_path / "dumps")
    target = str(tmp_path / "missing" / "x.html")
    for args in (["report", str(dumps), "-o", target], ["analyze", str(dumps), "--html", target],
                 ["export", str(dumps), "--html", target, "--out", str(tmp_path / "out")]):
        result = run_cli(*args)
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert "missing" in line and "does not exist" in line


def test_a_ca_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """Opening a FIFO blocks until a writer comes: the CA file is stat'ed first, one line, exit 2."""
    dumps = write_job(tmp_path / "dumps")
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    result = subprocess.run(
        [sys.executable, "-m", "fr_otel.cli", "export", str(dumps), "--endpoint", "https://127.0.0.1:1"],
        capture_output=True, text=True, timeout=20, env={**os.environ, "OTEL_EXPORTER_OTLP_CERTIFICATE": str(fifo)})
    assert result.returncode == 2 and "not a regular file" in result.stderr


def test_a_file_name_with_control_characters_is_escaped_in_json_problems_too(tmp_path: Path, run_cli) -> None:
    """ESC, newline and an undecodable byte in a dump's file name reach `--json` escaped: strict
    JSON, one problem per line, nothing a terminal would act on."""
    dumps = write_job(tmp_path / "dumps")
    (dumps / os.fsdecode(b"bad\x1b[2J\nHEALTHY\xff_rank_5")).write_bytes(b"not a pickle")
    result = run_cli("analyze", str(dumps), "--json")
    assert result.returncode == 0
    problems = json.loads(result.stdout)["problems"]
    text = json.dumps(problems, ensure_ascii=False)
    assert problems and "\x1b" not in text and "\\n" not in text and "\udcff" not in "".join(problems)
    assert any("HEALTHY" in p and "\\x1b" in p for p in problems)


def test_a_json_number_with_thousands_of_digits_is_one_plain_line(tmp_path: Path, run_cli) -> None:
    """Python's 4300-digit limit is not the user's business: the line says what is wrong with the file."""
    dumps = write_job(tmp_path / "dumps")
    (dumps / "rank_1").unlink()
    (dumps / "rank_1.json").write_text('{"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": '
                                       '[{"record_id": ' + "9" * 5000 + "}]}")
    result = run_cli("analyze", str(dumps))
    line = next(x for x in result.stdout.splitlines() + result.stderr.splitlines() if "rank_1.json" in x)
    assert "thousands of digits" in line and "set_int_max_str_digits" not in result.stdout + result.stderr


def test_an_output_folder_that_is_a_regular_file_is_named_as_such(tmp_path: Path, run_cli) -> None:
    """`--out FILE` (a folder is wanted) says it is a regular file, not "not a plain file"."""
    dumps = write_job(tmp_path / "dumps")
    (tmp_path / "file").write_text("")
    result = run_cli("export", str(dumps), "--out", str(tmp_path / "file"))
    assert result.returncode == 2 and "is a regular file, not a directory" in result.stderr
