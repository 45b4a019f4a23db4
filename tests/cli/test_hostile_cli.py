"""The CLI facing hostile names and outputs: one line and exit 2 before any work, nothing a terminal acts on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.hostile_dumps import cli, victim_with, write_job


def test_control_characters_in_file_names_do_not_reach_the_terminal(tmp_path: Path) -> None:
    """A newline in a file name cannot forge a line; ESC[2J cannot clear the screen."""
    bad = victim_with(input_dtypes=[None])
    write_job(tmp_path, bad, name="x\nfr-otel: HEALTHY\x1b[2J_1")
    proc = cli("analyze", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "\x1b" not in out and "\nfr-otel: HEALTHY" not in out and "x\\x0afr-otel: HEALTHY\\x1b[2J_1" in out


def test_the_size_cap_is_a_flag(tmp_path: Path) -> None:
    """--max-file-size lowers the cap; a bad value is a usage error."""
    write_job(tmp_path)
    proc = cli("analyze", str(tmp_path), "--max-file-size", "1k")
    assert proc.returncode == 2 and "no usable Flight Recorder dump" in proc.stderr
    assert cli("analyze", str(tmp_path), "--max-file-size", "lots").returncode == 2


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


def test_replay_of_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    proc = cli("replay", str(tmp_path / "nope.jsonl"), "--endpoint", "127.0.0.1:4317")
    assert proc.returncode == 2 and "no such file" in proc.stderr


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
