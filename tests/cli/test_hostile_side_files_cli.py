"""Every offline command on every hostile side file: no traceback, exit 0, one line."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.hostile_side_files import (
    ANY_SIDE_FILE,
    BY_NAME,
    SIDE_FILES,
    plant,
    small_job,
)

from fr_otel.cli import main

CASES = [(name, what, maker) for name in SIDE_FILES for what, (maker, _) in ANY_SIDE_FILE.items()] + [
    (name, what, maker) for name, cases in BY_NAME.items() for what, (maker, _) in cases.items()]
IDS = [f"{name}-{what}" for name, what, _ in CASES]


def trace_problems(out: Path) -> list[str]:
    """fr_otel.problems of the root span in the one trace file under ``out``."""
    (path,) = out.glob("fr-otel-trace-*.jsonl")
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    if span["name"] == "fr_otel.incident":
                        attrs = {a["key"]: a["value"] for a in span["attributes"]}
                        return [v["stringValue"] for v in attrs.get("fr_otel.problems", {}).get(
                            "arrayValue", {}).get("values", [])]
    raise AssertionError("no root span")


def named_once(lines: list[str], path: Path) -> bool:
    return len([p for p in lines if p.startswith(f"{path}: ")]) == 1


@pytest.fixture
def planted(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, Path]:
    name, _, maker = request.param
    folder = small_job(tmp_path / "dumps")
    return folder, plant(folder, name, maker)


@pytest.mark.parametrize("planted", CASES, ids=IDS, indirect=True)
def test_analyze_report_and_export_name_a_hostile_side_file_once(planted: tuple[Path, Path], tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """analyze --json, report and export (the embedded file) exit 0 with the hang found; the side
    file is one problem line in the JSON, on the page and in the trace; nothing raises."""
    folder, path = planted
    assert main(["analyze", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["rank"] for c in doc["culprits"]] == [3] and named_once(doc["problems"], path), doc["problems"]

    page = tmp_path / "page.html"
    assert main(["report", str(folder), "-o", str(page)]) == 0
    capsys.readouterr()
    assert html.unescape(page.read_text()).count(f"{path}: ") == 1

    out = tmp_path / "out"
    assert main(["export", str(folder), "--out", str(out), "--job-id", "matrix"]) == 0
    capsys.readouterr()
    assert named_once(trace_problems(out), path)


WATCHED = [c for c in CASES if c[0] != "incident.json"] + [c for c in CASES if c[0] == "incident.json" and c[1] in (
    "fifo", "directory", "looping link", "device link", "shell in a host name")]


@pytest.mark.parametrize("planted", WATCHED, ids=[f"{n}-{w}" for n, w, _ in WATCHED], indirect=True)
def test_watch_once_exports_beside_a_hostile_side_file(planted: tuple[Path, Path], tmp_path: Path) -> None:
    """`fr-otel watch --once` (a real process) exports the incident, exit 0, no traceback; a
    hostile ranks.json or steps.json is one line in the trace; a planted incident.json is never
    written through."""
    folder, path = planted
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FR_OTEL_"))}
    result = subprocess.run([sys.executable, "-m", "fr_otel.cli", "watch", str(folder), "--once", "--settle", "0",
                             "--deadline", "0", "--poll", "0.1", "--out", str(out), "--world-size", "4"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    if path.name != "incident.json":
        assert named_once(trace_problems(out), path), trace_problems(out)
