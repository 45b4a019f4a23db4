"""Rules the renderings share have one home: the op's name, the verdict's headline line."""

from __future__ import annotations

from pathlib import Path

from fr_otel.cli import main
from fr_otel.read.columns import comparable_fingerprint
from fr_otel.read.dump import op_name
from fr_otel.report.text import render_verdict, verdict_line
from fr_otel import analyze, build_job, read_dumps
from fr_otel.testing.dump_builder import DumpBuilder


def test_op_name_drops_the_backend_prefix_and_keeps_a_bare_name() -> None:
    """``nccl:all_reduce`` -> ``all_reduce``; a name without a prefix (or with an empty op) stands for itself."""
    assert op_name("nccl:all_reduce") == "all_reduce"
    assert op_name("gloo:send 0->1") == "send 0->1"
    assert op_name("all_gather") == "all_gather"
    assert op_name("nccl:") == "nccl:"


def test_the_entry_and_the_cross_rank_fingerprint_name_an_op_by_the_same_rule(tmp_path: Path) -> None:
    """Entry.op and the fingerprint the mismatch check compares both use op_name."""
    b = DumpBuilder(2, backend="gloo")
    b.collective(b.world, op="_allgather_base")
    dump = read_dumps(str(b.write(tmp_path / "dumps"))).dumps[0]
    e = dump.entries[0]
    assert e.op == op_name(e.profiling_name) == "_allgather_base"
    raw = (e.profiling_name, e.input_sizes, e.input_dtypes, e.output_sizes, e.output_dtypes)
    assert comparable_fingerprint(raw)[0] == e.op


def test_fr_otel_report_prints_the_text_verdicts_headline(tmp_path: Path, capsys) -> None:
    """`fr-otel report` prints the same verdict line the text verdict opens with (gloss included)."""
    b = DumpBuilder(4)
    b.collective(b.world)
    b.collective(b.world, per_rank={3: {"op": "all_gather"}}, done=False)
    folder = b.write(tmp_path / "dumps")
    verdict = analyze(build_job(read_dumps(str(folder))))
    line = verdict_line(verdict)
    assert render_verdict(verdict).splitlines()[0] == f"fr-otel: {line}"
    assert main(["report", str(folder), "-o", str(tmp_path / "r.html")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == line and line.startswith(verdict.verdict.upper())
