"""The live agent never writes its incident's files through links planted for them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from support.jobs import Job, job_env, torchrun

from fr_otel.testing.otlp import wait_for
from fr_otel.common.ids import trace_id_for

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
]

NAMES = ("fr_trace_rank_0", "fr_trace_rank_1", "ranks.json", "steps.json", "incident.json", "incident.html")



def test_links_planted_where_the_agent_writes_an_incident_are_replaced_not_followed(tmp_path: Path,
                                                                                    jobs: list[Job]) -> None:
    """The incident's folder is predictable (<out>/dumps/<trace id of job id and incident 1>/):
    every file the agent writes there (each rank's dump, ranks.json, steps.json, incident.json,
    incident.html) is planted as a link to a file elsewhere first. After the incident each is a
    regular file the agent wrote, and every target still holds what it held."""
    trace = f"{trace_id_for('planted-agent', '1'):032x}"
    folder = tmp_path / "out" / "dumps" / trace
    folder.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in NAMES:
        (elsewhere / name).write_text("precious\n")
        (folder / name).symlink_to(elsewhere / name)
    env = job_env(tmp_path, TRAIN_LOOP_AGENT="early", TRAIN_LOOP_STALL_RANK="1", TRAIN_LOOP_STALL_STEP="3",
                  TRAIN_LOOP_STALL_SECONDS="8", TRAIN_LOOP_STEPS="6", TRAIN_LOOP_GLOO_TIMEOUT="60",
                  FR_OTEL_METRICS_PORT="off", FR_OTEL_STALL_SECONDS="2", FR_OTEL_JOB_ID="planted-agent")
    job = Job(torchrun(2), env, tmp_path)
    jobs.append(job)
    assert job.wait() == 0, job.output[-4000:]
    assert wait_for(lambda: (folder / "incident.html").is_file() and not (folder / "incident.html").is_symlink(),
                    timeout=10), job.output[-4000:]
    for name in NAMES:
        assert (elsewhere / name).read_text() == "precious\n", name
        assert (folder / name).is_file() and not (folder / name).is_symlink(), name
    assert (folder / "fr_trace_rank_1").read_bytes()[:1] == b"\x80"  # torch's pickle, written by rank 1 itself
