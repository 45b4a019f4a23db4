"""Hostile dumps, every field: never a traceback, the healthy ranks always analysed.

The field fuzz: 24 hostile values x every entry field (in one
entry, and in all entries) and every top-level path, as pickle and as JSON, each
through read -> analyse -> text report -> trace -> OTLP encoding -> HTML, in process
(a few ms a run). A sample of the same files goes through the real CLI to prove the
exit codes. Then Hypothesis generates whole dumps with any value anywhere.
"""

from __future__ import annotations

import copy
import json
import math
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fr_otel import analyze, build_job
from fr_otel.report.html import render
from fr_otel.otlp.chunks import to_requests
from fr_otel.read.dump_file import parse_dump_bytes
from fr_otel.read.reader import ReadResult, read_dumps
from fr_otel.trace.spans import build_trace
from fr_otel.report.text import render_verdict
from support.hostile_dumps import STUCK, VICTIM, WORLD, nccl_dump

def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


#: 24 hostile values: wrong types, out-of-range numbers, hostile text, odd shapes, sheer size.
HOSTILE: list[Any] = [
    None, True, -1, 0, 2**63, -(2**63) - 1, 10**400, 1.5, math.nan, math.inf, "", "30000", "1.5ms",
    "\x1b[2J\nHEALTHY\ud800", "x" * 200_000, b"\xff\xfe", [], [None], [[1, "a"]], [[-1, 2**64]],
    {"a": {"b": 1}}, ("a", "b", "c"), _deep(200), [0] * 20_000,
]
assert len(HOSTILE) == 24

ENTRY_FIELDS = [*nccl_dump(0)["entries"][0], "frames.0", "frames.0.name", "frames.0.line", "<entry>", "unknown_key"]
TOP_PATHS = [
    "<file>", "version", "comm_lib_version", "nccl_version", "entries", "pg_config", "pg_config.0",
    "pg_config.0.ranks", "pg_config.0.name", "pg_status", "pg_status.0", "pg_status.0.last_enqueued_collective",
    "pg_status.0.last_completed_collective", "fr_otel_process", "fr_otel_process.pid", "fr_otel_process.host",
]


def _set(doc: Any, path: str, value: Any) -> Any:
    """``doc`` with the value at dotted ``path`` replaced (``<file>``: the whole document)."""
    if path == "<file>":
        return value
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if not isinstance(node, (dict, list)):
            return doc
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return doc


def hostile_dump(path: str, mode: str, value: Any) -> dict[str, Any]:
    doc = nccl_dump(VICTIM)
    if mode == "top":
        return _set(doc, path, value)
    entries = doc["entries"]
    for i in [len(entries) - 1] if mode == "one" else range(len(entries)):
        if path == "<entry>":
            entries[i] = value
        else:
            _set(entries[i], path, value)
    return doc


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def encode(doc: Any, fmt: str) -> bytes:
    if fmt == "pickle":
        return pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL)
    # allow_nan: Python's json writes NaN/Infinity, as torch's JSON dumps never do: hostile on purpose
    return json.dumps(_jsonable(doc)).encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def healthy() -> dict[int, Any]:
    """The other ranks, read once (they never change)."""
    out = {}
    for rank in range(WORLD):
        if rank != VICTIM:
            out[rank] = parse_dump_bytes(pickle.dumps(nccl_dump(rank)), rank, f"rank_{rank}")
    return out


def run_everything(healthy: dict[int, Any], data: bytes, *, html: bool = True) -> tuple[Any, Any, list[str]]:
    """Everything a user can ask of one job with this file as rank VICTIM; raises only on a bug."""
    problems: list[str] = []
    dumps = dict(healthy)
    victim = parse_dump_bytes(data, VICTIM, f"rank_{VICTIM}", problems=problems)
    if victim is not None:
        dumps[VICTIM] = victim
    job = build_job(ReadResult(dumps=dumps, problems=problems))
    verdict = analyze(job)
    text = render_verdict(verdict)
    text.encode("utf-8")  # what a terminal gets: no lone surrogate may survive
    assert all(c.isprintable() or c == "\n" for c in text), "a control character reached the text report"
    trace = build_trace(job, verdict)
    requests = to_requests(trace.spans)
    assert sum(r.ByteSize() for r in requests) < 4 << 20, "attributes were not clipped"
    if html:
        render(job, verdict)
    return job, verdict, problems


def test_the_fixture_job_is_a_hang_on_the_stuck_rank(healthy: dict[int, Any]) -> None:
    """Unmodified, the synthetic job is a hang whose culprit is the rank that missed the last all_reduce."""
    job, verdict, problems = run_everything(healthy, encode(nccl_dump(VICTIM), "pickle"))
    assert verdict.verdict == "hang" and [c.rank for c in verdict.culprits] == [STUCK], render_verdict(verdict)
    assert problems == []


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_field_fuzz_every_path_every_hostile_value(healthy: dict[int, Any], fmt: str) -> None:
    """24 hostile values x every entry field (one entry, all entries) and top-level path: no exception,
    healthy ranks always analysed, each run far under 20 s."""
    cases = [(p, m) for p in ENTRY_FIELDS for m in ("one", "all")] + [(p, "top") for p in TOP_PATHS]
    slowest = 0.0
    runs = 0
    for path, mode in cases:
        for n, value in enumerate(HOSTILE):
            data = encode(hostile_dump(path, mode, copy.deepcopy(value)), fmt)
            began = time.monotonic()
            try:
                job, verdict, problems = run_everything(healthy, data, html=(n % 8 == 0))
            except Exception as exc:  # pragma: no cover - what this test exists to catch
                raise AssertionError(f"{fmt} {mode} {path} = {value!r:.60}: {type(exc).__name__}: {exc}") from exc
            slowest = max(slowest, time.monotonic() - began)
            runs += 1
            assert set(healthy) <= set(job.dumps), (path, mode, value)
            assert all("\n" not in p for p in problems)
    assert runs == len(cases) * 24
    assert slowest < 20


@pytest.fixture(scope="module")
def hostile_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A few of the worst cases as real dump folders for the CLI."""
    out = {}
    for name, path, mode, value, fmt in [
        ("time_neg_all_pickle", "time_created_ns", "all", -1, "pickle"),
        ("dtypes_none_json", "input_dtypes", "one", [None], "json"),
        ("huge_text_all_pickle", "input_dtypes", "all", ["x" * 1_000_000], "pickle"),
        ("control_chars_top_json", "version", "top", "\x1b[2J\n\ud800", "json"),
    ]:
        folder = tmp_path_factory.mktemp(name)
        for rank in range(WORLD):
            doc = hostile_dump(path, mode, value) if rank == VICTIM else nccl_dump(rank)
            suffix = ".json" if fmt == "json" else ""
            (folder / f"rank_{rank}{suffix}").write_bytes(encode(doc, fmt))
        out[name] = folder
    return out


@pytest.mark.parametrize("command", ["analyze", "report", "export"])
def test_cli_on_hostile_dumps_exits_cleanly(hostile_dirs: dict[str, Path], tmp_path: Path, command: str) -> None:
    """The real CLI on hostile folders: exit 0/2/3 only, no traceback, under 20 s each."""
    for name, folder in hostile_dirs.items():
        extra = {"analyze": ["--json"], "report": ["-o", str(tmp_path / f"{name}.html")],
                 "export": ["--out", str(tmp_path / "out")]}[command]
        began = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "fr_otel.cli", command, str(folder), *extra],
                              capture_output=True, text=True, timeout=60, env=_no_otel_env())
        assert time.monotonic() - began < 20
        assert proc.returncode in (0, 2, 3), proc.stderr
        assert "Traceback" not in proc.stderr + proc.stdout
        assert "\x1b" not in proc.stderr + proc.stdout


def _no_otel_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FR_OTEL_"))}


# --------------------------------------------------------------------------- Hypothesis: any value anywhere

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True),
    st.text(max_size=30), st.binary(max_size=10),
)
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                       max_leaves=12)
_entry_keys = st.sampled_from(list(nccl_dump(0)["entries"][0]) + ["frames"])


@st.composite
def _mutated_dumps(draw: st.DrawFn) -> dict[str, Any]:
    doc = nccl_dump(VICTIM)
    for _ in range(draw(st.integers(1, 6))):
        where = draw(st.sampled_from(["entry", "entry", "entry", "top"]))
        if where == "top":
            doc[draw(st.sampled_from(["version", "pg_config", "pg_status", "entries", "comm_lib_version"]))] = \
                draw(_values)
        elif isinstance(doc.get("entries"), list) and doc["entries"]:
            i = draw(st.integers(0, len(doc["entries"]) - 1))
            if isinstance(doc["entries"][i], dict):
                doc["entries"][i][draw(_entry_keys)] = draw(_values)
    return doc


@settings(max_examples=60, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_mutated_dumps(), fmt=st.sampled_from(["pickle", "json"]))
def test_generated_dumps_never_break_anything(healthy: dict[int, Any], doc: dict[str, Any], fmt: str) -> None:
    """Hypothesis: any field of any type through read, analyse, report and export: no exception."""
    job, _, _ = run_everything(healthy, encode(doc, fmt), html=False)
    assert set(healthy) <= set(job.dumps)


def test_read_dumps_of_a_generated_folder_reports_one_line_per_problem(tmp_path: Path) -> None:
    """Through the file reader too (size cap, memory budget): every problem is one printable line."""
    for rank in range(WORLD):
        doc = hostile_dump("time_created_ns", "all", "\x1b[2J") if rank == VICTIM else nccl_dump(rank)
        (tmp_path / f"rank_{rank}").write_bytes(pickle.dumps(doc))
    read = read_dumps(tmp_path)
    assert set(read.dumps) == set(range(WORLD))  # the victim's entries dropped, not the rank
    hits = [p for p in read.problems if f"rank_{VICTIM}" in p]
    assert len(hits) == 1 and "6 malformed entries skipped" in hits[0] and "time_created_ns" in hits[0]
