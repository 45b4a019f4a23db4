"""Hostile dump values become span attributes that encode: escaped text, clipped lists, no SDK warnings."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from support.hostile_dumps import (
    STUCK,
    VICTIM,
    everything,
    nccl_dump,
    victim_with,
    write_job,
)

from fr_otel.otlp.chunks import to_requests
from fr_otel.trace.spans import build_trace


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
