"""The library call gives the CLI's answer: ``fr_otel.analyze_incident`` runs the pipeline ``fr-otel analyze`` runs."""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import pytest

import fr_otel
from fr_otel.cli import main
from fr_otel.common.ids import trace_id_for
from fr_otel.incident.files import write_identity
from fr_otel.read.incident_file import IncidentIdentity

INCIDENTS = ("gpu_error_1st", "gpu_error_2nd", "lock_gil_1st", "lock_gil_2nd")


def cli_json(*args: str) -> str:
    """What ``fr-otel analyze ARGS --json`` prints (in this process: the same code as the console script)."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["analyze", *args, "--json"]) == 0
    return out.getvalue()


@pytest.mark.parametrize("incident", INCIDENTS)
def test_the_library_call_prints_what_the_cli_prints_on_every_nvrx_incident(nvrx: Path, incident: str) -> None:
    """analyze_incident(folder).to_json() is byte for byte the line `fr-otel analyze folder --json` prints."""
    result = fr_otel.analyze_incident(nvrx / incident)
    assert cli_json(str(nvrx / incident)) == result.to_json() + "\n"
    assert result.to_dict()["culprits"], "a real hang: the answer names culprits"


def test_the_library_call_applies_incident_json_as_the_cli_does(nvrx: Path, tmp_path: Path) -> None:
    """A folder a live agent left (incident.json: the trace id, raised as the job ended) gives the
    library the CLI's trace id and ending analysis, which the bare analyze(build_job(...)) lacks."""
    folder = tmp_path / "incident"
    shutil.copytree(nvrx / "lock_gil_1st", folder)
    job_id = "torchelastic:run-7/restart-0"
    write_identity(folder, IncidentIdentity(
        job_id=job_id, incident="2", trace_id=f"{trace_id_for(job_id, '2'):032x}",
        root_attributes=(("fr_otel.incident.number", 2), ("fr_otel.incident.reason", "SIGTERM"))))
    result = fr_otel.analyze_incident(folder, straggler_threshold_s=2.5)
    doc = json.loads(cli_json(str(folder), "--straggler-threshold", "2.5"))
    assert doc == result.to_dict()
    assert doc["trace_id"] == f"{trace_id_for(job_id, '2'):032x}"
    job = fr_otel.build_job(fr_otel.read_dumps(folder))
    assert "trace_id" not in fr_otel.analyze(job).to_dict()
    ending = fr_otel.analyze(job, fr_otel.AnalysisOptions(straggler_threshold_s=2.5, ending=True))
    assert {**ending.to_dict(), "trace_id": doc["trace_id"], "exclude_hosts": [], "action": None} == doc  # raised as the job ended


def test_a_folder_without_a_dump_is_one_exception_naming_why(tmp_path: Path) -> None:
    """No readable dump: NoUsableDump (a ValueError) carries each file's problem line, no traceback to parse."""
    (tmp_path / "rank_0").write_bytes(b"not a pickle")
    with pytest.raises(fr_otel.NoUsableDump) as caught:
        fr_otel.analyze_incident(tmp_path)
    assert isinstance(caught.value, ValueError) and str(caught.value) == "no usable Flight Recorder dump"
    assert any("rank_0" in line for line in caught.value.problems), caught.value.problems
