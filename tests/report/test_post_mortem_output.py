"""An honest post-mortem. No age is printed that the dumps cannot support (the
same words in the terminal, the page, the JSON and the trace), the next step is in the terminal
too and fits a process that is gone, and the stop order is said in short lines."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from fr_otel import AnalysisOptions, analyze, build_job, read_dumps
from fr_otel.diagnosis.verdict import UNKNOWN_STALL
from fr_otel.report.html import render
from fr_otel.report.text import render_verdict
from fr_otel.testing.dump_builder import DumpBuilder


def _copy(nvrx: Path, name: str, tmp_path: Path, *, written_after_s: float | None) -> Path:
    """The real incident ``name``, its files dated ``written_after_s`` after its newest activity
    (None: dated two days later, which no reader believes: undated)."""
    folder = shutil.copytree(nvrx / name, tmp_path / name)
    latest = build_job(read_dumps(folder)).latest_ns
    when = latest + int((written_after_s if written_after_s is not None else 2 * 86400) * 1e9)
    for f in folder.iterdir():
        os.utime(f, ns=(when, when))
    return folder


def _trace_statuses(job, verdict) -> list[str]:  # type: ignore[no-untyped-def]
    from fr_otel.trace.spans import build_trace

    return [s.status.description or "" for s in build_trace(job, verdict).spans]


def test_undated_dumps_say_stall_duration_unknown_and_print_no_age(nvrx: Path, tmp_path: Path) -> None:
    """A hang of 180 s dumped without a usable file time: nowhere "0.0 s" or "7.3 ms": every output says the duration is unknown."""
    job = build_job(read_dumps(_copy(nvrx, "gpu_error_1st", tmp_path, written_after_s=None)))
    v = analyze(job)
    assert v.reference_source == "latest_activity" and not v.dated
    text = render_verdict(v)
    assert UNKNOWN_STALL in text and "in flight 0." not in text and "before the last recorded activity" not in text
    page = render(job, v)
    assert UNKNOWN_STALL in page
    assert "at the reference time)" not in page and not re.search(r" for [\d.]+ (ms|µs|s) \(not completed\)", page)
    assert not re.search(r"in flight [\d.]+ (ms|µs|s)", page)
    doc = v.to_dict()
    assert [g["in_flight"]["age_s"] for g in doc["groups"] if g["in_flight"]] == [None] * 26
    statuses = [s for s in _trace_statuses(job, v) if s]
    assert statuses and all("in flight 0." not in s for s in statuses)
    assert any(s.startswith(UNKNOWN_STALL) for s in statuses)


def test_dated_dumps_say_how_long_each_collective_was_in_flight(nvrx: Path, tmp_path: Path) -> None:
    """Dumped 180 s after the last activity: the terminal, the page and the JSON give that age, and never the unknown."""
    job = build_job(read_dumps(_copy(nvrx, "gpu_error_1st", tmp_path, written_after_s=180)))
    v = analyze(job)
    assert v.dated
    text = render_verdict(v)
    assert UNKNOWN_STALL not in text
    assert re.search(r"EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP \(94\): _all_gather_base #3429, .*; in flight 3 min 0 s "
                     "when dumped", text), text
    page = render(job, v)
    assert UNKNOWN_STALL not in page and "3 min 0 s when dumped" in page
    ages = [g["in_flight"]["age_s"] for g in v.to_dict()["groups"] if g["in_flight"]]
    assert ages and all(180 <= a < 181 for a in ages)


def test_the_terminal_prints_the_next_step_worded_for_a_watchdog_dump(nvrx: Path, run_cli) -> None:
    """NCCL's own dumps (the process aborted after writing them): `next:` under each culprit points at its log and dmesg, not at py-spy on a live process."""
    out = run_cli("analyze", str(nvrx / "lock_gil_2nd"))
    assert out.returncode == 0, out.stderr
    blocks = out.stdout.split("\n\n  rank ")[1:3]
    assert [b.split(":", 1)[0] for b in blocks] == ["10", "15"]
    for rank, block in zip((10, 15), blocks):
        steps = block[block.index("next: "):]
        assert f"Rank {rank} never reached _all_gather_base" in steps
        assert f"Its process is gone (NCCL aborts a process once its watchdog has written a dump like this): look at rank {rank}'s log" in steps
        assert "`dmesg -T`" in steps and "while it is still alive" not in steps
    gpu = run_cli("analyze", str(nvrx / "gpu_error_1st")).stdout
    assert "next: Rank 12 entered _all_gather_base #3429 but its GPU or network never finished it" in gpu
    assert "`dmesg | grep -i xid`" in gpu and "next: as for rank 12" in gpu  # rank 14's step is the same


def _gloo_hang(tmp_path: Path) -> Path:
    """4 gloo ranks; rank 3 never enqueues the world's 3rd all_reduce (pulled from live processes)."""
    job = DumpBuilder(4, backend="gloo")
    job.collective(job.world)
    job.collective(job.world)
    job.collective(job.world, ranks=[0, 1, 2], done=False)
    return job.write(tmp_path / "gloo")


def test_a_pulled_gloo_dump_gets_py_spy_and_a_job_that_ended_gets_its_log(tmp_path: Path) -> None:
    """The same culprit: alive (gloo never dumps itself) -> py-spy on its process; the incident raised as the job ended -> its log and dmesg."""
    job = build_job(read_dumps(_gloo_hang(tmp_path)))
    alive = render_verdict(analyze(job))
    assert "next: Rank 3 never reached all_reduce #3" in alive and "`py-spy dump --pid PID`" in alive
    assert "process is gone" not in alive
    ended = analyze(job, AnalysisOptions(ending=True))
    assert ended.job_ended and ended.to_dict()["job_ended"] is True
    text = render_verdict(ended)
    assert "Its process is gone (the incident was raised as the job ended): look at rank 3's log" in text
    assert "Its process is gone (the incident was raised as the job ended)" in render(job, ended)


def test_the_stop_order_is_said_in_short_lines(nvrx: Path) -> None:
    """lock_gil_2nd's stop order (one ~400-character sentence before) is five lines, none over 140 characters."""
    v = analyze(build_job(read_dumps(nvrx / "lock_gil_2nd")))
    assert v.stop_order is not None
    lines = v.stop_order.lines()
    assert lines == [
        "rank 15 stopped first in program order: its last enqueued is #3498 on EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP (94)",
        "rank 10 got further: #3499 on EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP (93)",
        "no recorded activity dates the stops",
        "rank 10 stopped before 06:45:38.267 UTC, when its peers entered #3500 on EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP "
        "(93) (peers' clocks)",
        "rank 15 stopped before 06:45:38.273 UTC, when its peers entered #3499 on EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP "
        "(94) (peers' clocks)",
    ]
    assert max(map(len, lines)) <= 140
    text = render_verdict(v)
    assert all(f"\n  {line}\n" in text for line in lines)


def test_the_json_age_is_null_without_a_dump_time(nvrx: Path, tmp_path: Path, run_cli) -> None:
    """`analyze --json` of undated dumps: in_flight.age_s is null with reference_source latest_activity (README's schema)."""
    out = run_cli("analyze", str(_copy(nvrx, "lock_gil_1st", tmp_path, written_after_s=None)), "--json")
    doc = json.loads(out.stdout)
    assert doc["reference_source"] == "latest_activity"
    assert {g["in_flight"]["age_s"] for g in doc["groups"] if g["in_flight"]} == {None}


def test_what_to_do_follows_the_evidence_in_the_terminal_and_the_page() -> None:
    """A rank hung in its own code (the lab's rank 5, every node's folder): "What to do: fix the code" with its call
    site and the software domain beside its cause, and no host, drain, cordon or --exclude anywhere; a frozen host
    (node2): restart elsewhere, with the commands that leave node2 out; one node's folder whose live verdict recorded
    no cause: restart in place, no host named."""
    from fr_otel import analyze_incident

    data = Path(__file__).resolve().parents[1] / "data" / "node-folders"
    code = analyze_incident(data / "code_hang")
    text, page = render_verdict(code.verdict), render(code.job, code.verdict)
    assert "What to do: fix the code: rank(s) 5 stopped in their own code (software)" in text, text
    assert "  rank 5: " in text and "train_loop.py:137 in main" in text.split("What to do:", 1)[1]
    assert "[software]" in text and "software: its own code or process" in page and "What to do</b>: fix the code" in page
    for out in (text, page):
        assert not [w for w in ("Leave out", "--exclude", "DRAIN", "cordon") if w in out]
    frozen = analyze_incident(data / "freeze" / "node0")
    text, page = render_verdict(frozen.verdict), render(frozen.job, frozen.verdict)
    assert "What to do: restart elsewhere, leaving out node2" in text and "sbatch --exclude=node2 JOB_SCRIPT" in text
    assert "Leave out next time</b>: node2" in page and "kubectl cordon node2" in page
    unsure = render_verdict(analyze_incident(data / "code_hang" / "node1").verdict)
    assert "What to do: restart in place" in unsure and "--exclude" not in unsure and "DRAIN" not in unsure


def test_fix_the_code_names_only_the_ranks_whose_own_code_stopped() -> None:
    """A second culprit with no evidence whose fault it is (stopped) beside one in its own code: the action is still
    to fix the code, and it names the software culprit alone, with its call site."""
    from dataclasses import replace

    from fr_otel import analyze_incident
    from fr_otel.diagnosis.cause_kinds import Cause, CauseClass
    from fr_otel.report.action import action_lines

    data = Path(__file__).resolve().parents[1] / "data" / "node-folders"
    v = analyze_incident(data / "code_hang").verdict
    (five,) = v.blamed
    stopped = replace(five, rank=4, now=None, cause=Cause(CauseClass.STOPPED, ("/proc/7: stopped",)))
    text = "\n".join(action_lines(replace(v, culprits=[five, stopped])))
    assert "fix the code: rank(s) 5 stopped in their own code" in text and "rank 4:" not in text, text
