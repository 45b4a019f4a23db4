"""A group is named one way everywhere (its desc and name, a send/recv group
said to be one), `related[]` has the shape of `culprits[]`, and what the terminal leaves out says
where to see it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fr_otel import analyze, build_job, read_dumps
from fr_otel.report.html import render
from fr_otel.report.text import render_verdict


def test_related_evidence_has_the_shape_of_a_culprit(nvrx: Path, run_cli) -> None:
    """Every related item: process_group {name, desc} like its culprit's, and op filled with the call its evidence names."""
    for incident in ("gpu_error_1st", "lock_gil_1st", "lock_gil_2nd"):
        doc = json.loads(run_cli("analyze", str(nvrx / incident), "--json").stdout)
        groups = {g["name"]: g["desc"] for g in doc["groups"]}
        related = [r for c in doc["culprits"] for r in c["related"]]
        assert related, incident
        for c in doc["culprits"]:
            for r in c["related"]:
                assert set(r) == {"kind", "process_group", "collective_seq_id", "evidence", "op", "waiting_ranks", "peer"}
                assert set(r) < set(c) and isinstance(r["process_group"], dict)
                assert r["process_group"] == {"name": r["process_group"]["name"], "desc": groups[r["process_group"]["name"]]}
                assert r["op"], r
                assert r["op"].partition(":")[2] in r["evidence"], r  # `nccl:all_reduce` for "... wait in all_reduce #7010 ..."


def test_a_group_is_named_by_desc_and_name_in_the_terminal_the_page_and_the_trace(nvrx: Path) -> None:
    """lock_gil_1st: the follow-ups say TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP (64), never `group 64`; the trace's culprit events carry the desc."""
    from fr_otel.trace import attributes as A
    from fr_otel.trace.spans import build_trace

    job = build_job(read_dumps(nvrx / "lock_gil_1st"))
    v = analyze(job)
    text = render_verdict(v)
    assert not re.search(r"\bgroup \d+\b", text), re.findall(r".*\bgroup \d+\b.*", text)
    assert "also not_enqueued on TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP (64) #15118 nccl:all_reduce" in text
    page = render(job, v)
    assert "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP (64) #15118 nccl:all_reduce" in page
    root = next(s for s in build_trace(job, v).spans if s.name == "fr_otel.incident")
    events = [e for e in root.events if e.name == "culprit"]
    assert [(e.attributes[A.PG_NAME], e.attributes[A.PG_DESC]) for e in events] == [
        ("37", "TENSOR_MODEL_PARALLEL_GROUP"), ("38", "TENSOR_MODEL_PARALLEL_GROUP")]


def test_a_send_recv_group_is_said_to_be_one(nvrx: Path) -> None:
    """Pipeline evidence reads `PIPELINE_MODEL_PARALLEL_GROUP (57), send/recv nccl:send 0->1`, in the terminal and on the page."""
    job = build_job(read_dumps(nvrx / "lock_gil_1st"))
    v = analyze(job)
    text = render_verdict(v)
    assert "also not_enqueued on PIPELINE_MODEL_PARALLEL_GROUP (57), send/recv nccl:send 0->1, waited on by 6" in text
    assert "PIPELINE_MODEL_PARALLEL_GROUP (57), send/recv nccl:send 0-&gt;1" in render(job, v)


def test_what_the_terminal_leaves_out_says_where_to_see_it(nvrx: Path) -> None:
    """'… and 8 more group(s)' and '… 16 more group(s)' name --json and the HTML report."""
    text = render_verdict(analyze(build_job(read_dumps(nvrx / "gpu_error_1st"))))
    more = [line.strip() for line in text.splitlines() if line.strip().startswith("…")]
    assert more == [
        "… and 8 more group(s); all in --json and the HTML report (fr-otel report DIR -o incident.html)",
        "… and 4 more group(s); all in --json and the HTML report (fr-otel report DIR -o incident.html)",
        "… 16 more group(s); all in --json and the HTML report (fr-otel report DIR -o incident.html)",
    ]
