"""The files beside the dumps are read through one bounded boundary."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.hostile_side_files import (
    ANY_SIDE_FILE,
    BY_NAME,
    SIDE_FILES,
    plant,
    small_job,
    valid_incident,
)

from fr_otel import analyze, build_job, read_dumps
from fr_otel.read.incident_file import read_identity
from fr_otel.read.rank_map import read_rank_map
from fr_otel.read.steps import read_steps_file

READERS = {
    "ranks.json": read_rank_map,
    "steps.json": read_steps_file,
    "incident.json": read_identity,
}
CASES = [(name, what, maker, words) for name in SIDE_FILES for what, (maker, words) in ANY_SIDE_FILE.items()] + [
    (name, what, maker, words) for name, cases in BY_NAME.items() for what, (maker, words) in cases.items()]


@pytest.mark.parametrize(("name", "what", "maker", "words"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_hostile_side_file_is_one_problem_line_naming_it(tmp_path: Path, name: str, what: str, maker, words: str
                                                           ) -> None:
    """Each reader (ranks.json, steps.json, incident.json) turns a hostile file into exactly one
    line naming the file and what is wrong, and never raises."""
    path = plant(tmp_path, name, maker)
    problems: list[str] = []
    READERS[name](str(path), problems)
    assert len(problems) == 1 and problems[0].startswith(f"{path}: ") and words in problems[0], problems
    assert all(c.isprintable() for c in problems[0])


@pytest.mark.parametrize(("name", "what", "maker", "words"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_the_analysis_of_a_folder_with_a_hostile_side_file_names_it_once(tmp_path: Path, name: str, what: str,
                                                                         maker, words: str) -> None:
    """read_dumps (which reads every side file, incident.json included, as the CLI and the library
    do): the 4 ranks are analysed (rank 3 hangs) and the side file costs one line, whatever it is."""
    folder = small_job(tmp_path / "dumps")
    path = plant(folder, name, maker)
    read = read_dumps(folder)
    job = build_job(read)
    verdict = analyze(job)
    assert [c.rank for c in verdict.culprits] == [3]
    hits = [p for p in job.problems if p.startswith(f"{path}: ")]
    assert len(hits) == 1 and words in hits[0], job.problems


def test_ascii_digits_are_the_only_rank_keys(tmp_path: Path) -> None:
    """'²', '٣' (Arabic-Indic three) and '３' are digits to str.isdigit but not ranks; '7' is."""
    path = tmp_path / "ranks.json"
    path.write_text(json.dumps({"ranks": {"²": {"host": "a"}, "٣": {"host": "b"}, "３": {"host": "c"},
                                          "7": {"host": "node7"}, "99999999999": {"host": "d"}}}))
    problems: list[str] = []
    assert {r: p.host for r, p in read_rank_map(str(path), problems).items()} == {7: "node7"}
    assert problems == [f"{path}: 4 malformed rank entries ignored"]


def test_control_characters_and_surrogates_in_side_files_are_escaped_once(tmp_path: Path) -> None:
    """A consistent incident.json whose job id and stack text hold ESC, BEL and a lone surrogate:
    the identity is used, with those characters escaped for every consumer."""
    from fr_otel.common.ids import trace_id_for

    job_id = "job\\x1b]0;owned\\x07\\ud800"  # what the reader makes of the raw characters
    doc = valid_incident(job_id="job\x1b]0;owned\x07\ud800", trace_id=f"{trace_id_for(job_id, '3'):032x}")
    doc["ranks"] = {"3": {"host": "node3", "pid": 4243, "now": {"captured_ns": 1, "threads": [
        {"name": "Main\x1b[2J", "frames": [{"name": "f\ud800", "filename": "t.py", "line": 1}]}]}}}
    path = tmp_path / "incident.json"
    path.write_text(json.dumps(doc))
    problems: list[str] = []
    identity = read_identity(path, problems)
    assert identity is not None and problems == [], problems
    assert identity.job_id == job_id and identity.job_id.isprintable()
    thread = identity.stacks[3].threads[0]
    assert thread.name == "Main\\x1b[2J" and thread.frames[0].name == "f\\ud800"


def test_a_trace_id_that_its_job_id_and_incident_do_not_give_is_ignored(tmp_path: Path) -> None:
    """incident.json's trace id must be the one (job id, incident) hash to: a forged one is not
    reused for a trace."""
    path = tmp_path / "incident.json"
    path.write_text(json.dumps(valid_incident(trace_id="ab" * 16)))
    problems: list[str] = []
    assert read_identity(path, problems) is None
    assert problems == [f"{path}: its trace_id is not the one its job_id and incident give; ignored"]


def test_root_attributes_are_capped_in_count_key_and_size(tmp_path: Path) -> None:
    """At most 64, only the agent's fr_otel.incident.* keys, strings clipped to 2000 characters:
    one line says what was dropped or clipped."""
    attrs = [["fr_otel.incident.reason", "x" * 5000], ["service.name", "forged"], ["fr_otel.incident.n", 2**70]]
    attrs += [[f"fr_otel.incident.a{i}", i] for i in range(100)]
    path = tmp_path / "incident.json"
    path.write_text(json.dumps(valid_incident(root_attributes=attrs)))
    problems: list[str] = []
    identity = read_identity(path, problems)
    assert identity is not None
    kept = dict(identity.root_attributes)
    assert len(kept) == 62 and "service.name" not in kept and len(kept["fr_otel.incident.reason"]) == 2000
    assert problems == [f"{path}: root attributes: 41 ignored, 1 clipped to 2000 characters (at most 64 attributes, "
                        "fr_otel.incident.* keys of at most 128 characters, values str/int64/float/bool)"]


@pytest.mark.slow
def test_a_million_root_attributes_are_read_in_bounded_time_and_make_a_small_root_span(tmp_path: Path) -> None:
    """A 58 MiB file of 3 million attributes (once 38 s, 3.5 GB and a 148 MB trace): a
    million of them now make a root span of at most 64 (the trace stays a few hundred KB), read
    in linear time."""
    from fr_otel.incident.pipeline import IncidentPlan, evidence_from_files, run_incident
    from fr_otel.otlp.chunks import to_requests
    from fr_otel.trace.options import TraceOptions

    folder = small_job(tmp_path / "dumps")
    attrs = [[f"fr_otel.incident.x{i}", "v" * 8] for i in range(100)] + [["k", 1]] * 1_000_000  # 8 MiB
    (folder / "incident.json").write_text(json.dumps(valid_incident(root_attributes=attrs), separators=(",", ":")))
    started = time.process_time()
    incident = run_incident(evidence_from_files(folder), IncidentPlan(trace=TraceOptions()))
    assert incident.identity is not None and len(incident.identity.root_attributes) == 64
    assert incident.trace is not None
    size = sum(r.ByteSize() for r in to_requests(incident.trace.spans))
    assert size < 256 << 10 and time.process_time() - started < 30, (size, time.process_time() - started)
    assert any("root attributes: 1000036 ignored" in p for p in incident.job.problems)
