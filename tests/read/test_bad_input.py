"""Bad input: one clear line per problem, the rest still analysed, never a traceback, nothing run."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from fr_otel import analyze, build_job, read_dumps
from fr_otel.read.discovery import rank_from_name


@pytest.fixture
def job_dir(nvrx: Path, tmp_path: Path) -> Path:
    """A writable copy of a real 16-rank incident (lock_gil_2nd: culprits 10 and 15)."""
    dst = tmp_path / "dumps"
    shutil.copytree(nvrx / "lock_gil_2nd", dst)
    for f in dst.iterdir():
        f.chmod(0o644)
    return dst


class _RunsCode:
    """A pickle that, loaded naively, creates a marker file through os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def assert_one_line(problems: list[str], path: Path, words: str) -> None:
    hits = [p for p in problems if str(path) in p]
    assert len(hits) == 1, problems
    assert words in hits[0] and "\n" not in hits[0] and "Traceback" not in hits[0]


def test_truncated_pickle(job_dir: Path) -> None:
    """A cut-off file is reported; the other 15 ranks are analysed."""
    victim = job_dir / "_dump_3"
    victim.write_bytes(victim.read_bytes()[:700])
    read = read_dumps(job_dir)
    assert_one_line(read.problems, victim, "truncated or corrupt pickle")
    assert len(read.dumps) == 15
    verdict = analyze(build_job(read))
    assert {10, 15} <= {c.rank for c in verdict.culprits}


def test_malicious_pickle_runs_nothing(job_dir: Path, tmp_path: Path) -> None:
    """A pickle that asks for os.system is refused, and the marker file never appears."""
    marker = tmp_path / "pwned"
    victim = job_dir / "_dump_4"
    victim.write_bytes(pickle.dumps({"version": "2.10", "entries": [_RunsCode(marker)]}, protocol=2))
    read = read_dumps(job_dir)
    assert_one_line(read.problems, victim, "unsafe pickle")
    assert "system" in next(p for p in read.problems if str(victim) in p)
    assert not marker.exists()
    assert 4 not in read.dumps and len(read.dumps) == 15


def test_malicious_pickle_protocol_5(job_dir: Path, tmp_path: Path) -> None:
    """STACK_GLOBAL (protocol 4+) is refused too."""
    marker = tmp_path / "pwned5"
    victim = job_dir / "_dump_5"
    victim.write_bytes(pickle.dumps(_RunsCode(marker), protocol=5))
    read = read_dumps(job_dir)
    assert_one_line(read.problems, victim, "unsafe pickle")
    assert not marker.exists()


def test_json_garbage(job_dir: Path) -> None:
    victim = job_dir / "_dump_6.json"
    victim.write_text('{"version": "2.10", "entries": [')
    (job_dir / "_dump_6").unlink()
    read = read_dumps(job_dir)
    assert_one_line(read.problems, victim, "invalid JSON")


def test_not_a_dump_at_all(job_dir: Path) -> None:
    victim = job_dir / "_dump_7"
    victim.write_bytes(b"\x00\x01binary junk")
    read = read_dumps(job_dir)
    assert_one_line(read.problems, victim, "not a Flight Recorder dump")


def test_wrong_shape(job_dir: Path) -> None:
    """A valid pickle of the wrong shape, and a dump with malformed entries."""
    (job_dir / "_dump_8").write_bytes(pickle.dumps([1, 2, 3]))
    raw = pickle.loads((job_dir / "_dump_9").read_bytes())
    raw["entries"][0] = {"bogus": True}
    (job_dir / "_dump_9").write_bytes(pickle.dumps(raw))
    read = read_dumps(job_dir)
    assert_one_line(read.problems, job_dir / "_dump_8", "not a Flight Recorder dump")
    assert_one_line(read.problems, job_dir / "_dump_9", "1 malformed entry skipped")
    assert 9 in read.dumps


def test_empty_file_and_empty_directory(job_dir: Path, tmp_path: Path) -> None:
    (job_dir / "_dump_11").write_bytes(b"")
    read = read_dumps(job_dir)
    assert_one_line(read.problems, job_dir / "_dump_11", "empty file")
    empty = tmp_path / "empty"
    empty.mkdir()
    read = read_dumps(empty)
    assert read.dumps == {} and len(read.problems) == 1 and "no dump files" in read.problems[0]


def test_two_files_claim_one_rank(job_dir: Path) -> None:
    twin = job_dir / "host-b_dump_3"
    twin.write_bytes((job_dir / "_dump_3").read_bytes())
    read = read_dumps(job_dir)
    lines = [p for p in read.problems if "rank 3 is also claimed" in p]
    assert len(lines) == 1 and str(twin) in lines[0]
    assert len(read.dumps) == 16


def test_mixed_versions(job_dir: Path) -> None:
    raw = pickle.loads((job_dir / "_dump_0").read_bytes())
    raw["version"] = "2.10"
    raw["comm_lib_version"] = raw.pop("nccl_version")
    (job_dir / "_dump_0").write_bytes(pickle.dumps(raw))
    read = read_dumps(job_dir)
    mixed = [p for p in read.problems if "mixed dump versions" in p]
    assert len(mixed) == 1 and "2.10: 0" in mixed[0] and "2.9: 1-15" in mixed[0]
    verdict = analyze(build_job(read))
    assert {c.rank for c in verdict.culprits} == {10, 15}


def test_rank_from_file_name() -> None:
    """The trailing number is the rank, even with host names in the prefix."""
    assert rank_from_name("nccl_trace_rank_node02_5") == 5
    assert rank_from_name("comm_lib_trace_rank_12") == 12
    assert rank_from_name("rank_3.json") == 3
    assert rank_from_name("fault_injection.log") is None
    assert rank_from_name("trace_node02_5", prefix="trace_node02_") == 5
    assert rank_from_name("trace_node03_5", prefix="trace_node02_") is None


def test_prefix_selects_files(nvrx: Path, run_cli) -> None:
    proc = run_cli("analyze", str(nvrx / "lock_gil_2nd"), "--prefix", "_dump_1", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # With a prefix, what follows it is the rank: _dump_10.._dump_15 read as ranks 0-5.
    assert out["ranks_loaded"] == 6
    proc = run_cli("analyze", str(nvrx / "lock_gil_2nd"), "--prefix", "nccl_trace_rank_")
    assert proc.returncode == 2 and "no dump files" in proc.stderr


def test_cli_unusable_input_exits_2_without_traceback(tmp_path: Path, run_cli) -> None:
    bad = tmp_path / "rank_0"
    bad.write_text("not a dump")
    for target in (bad, tmp_path / "nope", tmp_path):
        proc = run_cli("analyze", str(target))
        assert proc.returncode == 2, proc
        assert "Traceback" not in proc.stderr and "no usable Flight Recorder dump" in proc.stderr


def test_cli_partial_input_exits_0_and_reports(job_dir: Path, run_cli) -> None:
    (job_dir / "_dump_2").write_bytes(b"\x80\x02}q\x00")  # truncated pickle
    proc = run_cli("analyze", str(job_dir), "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    out = json.loads(proc.stdout)
    assert out["ranks_loaded"] == 15 and any("_dump_2" in p for p in out["problems"])
