"""Hostile dumps at the reader: a bad field costs one line and its entry or file, never the job; bounded cost."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.hostile_dumps import (
    STUCK,
    VICTIM,
    WORLD,
    everything,
    nccl_dump,
    victim_with,
    write_job,
)

from fr_otel import analyze, build_job, read_dumps
from fr_otel.testing.dump_builder import DumpBuilder


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


@pytest.mark.parametrize("value", [
    "yesterday", [1], {"taken_ns": "1"}, {"taken_ns": -5}, {"taken_ns": 2**64}, {"taken_ns": True},
    {"taken_ns": 10**18, "pid": "x", "confirmed_ns": 5, "silent_since_ns": 2**70, "loaded_ns": [1]},
])
def test_a_forged_last_record_stamp_is_read_as_no_record_or_only_its_sound_times(tmp_path: Path, value: Any) -> None:
    """A dump claiming to be a silent rank's last record with a stamp of the wrong shape: the dump is read as a
    dump, its record is none without a believable ``taken_ns``, and every other ill-typed time is left out."""
    doc = nccl_dump(VICTIM)
    doc["fr_otel_last_record"] = value
    job, verdict, problems = everything(write_job(tmp_path, doc))
    record = job.dumps[VICTIM].record
    if isinstance(value, dict) and value.get("taken_ns") == 10**18:
        assert record is not None and (record.pid, record.confirmed_ns, record.silent_since_ns, record.loaded_ns) == (
            None, None, None, None) and record.age_s is None
    else:
        assert record is None
    assert [c.rank for c in verdict.culprits] == [STUCK]


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
