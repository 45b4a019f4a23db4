"""A SIGTERM that reaches a rank during an incident's flush is part of that incident."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
from support.jobs import Job, job_env, torchrun, wait_file

from fr_otel.testing.otlp import wait_for

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
]



def test_sigterm_to_the_coordinator_while_it_flushes_raises_no_second_incident(tmp_path: Path,
                                                                               jobs: list[Job]) -> None:
    """Rank 0 stalls 9 s; rank 1 raises incident 1 and, as its coordinator, waits on a collector
    that accepts connections and never answers (its export runs up to its 20 s timeout). The stall
    ends and training goes on; then rank 1 gets SIGTERM: its main thread waits in the handler for
    the flush, so rank 0 soon waits on it in the next all_reduce, past the 4 s stall threshold
    (not 2: on a loaded box the first all_reduce alone can wait 2 s for a late starter).
    That wait is the job ending, not a second incident blaming rank 1
    (`not_enqueued … in _flush_sigterm_once`, a second trace). Incident 1 is spooled, once, and
    rank 1 dies of SIGTERM when its part is done."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never accepts, never answers
        env = job_env(tmp_path, TRAIN_LOOP_AGENT="early", TRAIN_LOOP_STALL_RANK="0", TRAIN_LOOP_STALL_STEP="5",
                      TRAIN_LOOP_STALL_SECONDS="9", TRAIN_LOOP_STEPS="400", TRAIN_LOOP_GLOO_TIMEOUT="60",
                      FR_OTEL_METRICS_PORT="off", FR_OTEL_STALL_SECONDS="4", FR_OTEL_JOB_ID="sigterm-flush",
                      OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{silent.getsockname()[1]}",
                      OTEL_EXPORTER_OTLP_TIMEOUT="20", FR_OTEL_FLUSH_TIMEOUT="40")
        job = Job(torchrun(2), env, tmp_path)
        jobs.append(job)
        t0 = json.loads(wait_file(tmp_path / "markers" / "stall_start.json", job).read_text())["time"]
        assert wait_for(lambda: "raises incident 1" in job.output, timeout=30, interval=0.2), job.output[-4000:]
        assert "rank 1 raises incident 1" in job.output
        time.sleep(max(0.0, t0 + 9 + 1.5 - time.time()))  # the stall is over: both ranks train again
        assert "incident 1 (stall" not in job.output  # rank 1 is still flushing (exporting) incident 1
        pid1 = int((tmp_path / "markers" / "pid_rank_1").read_text())
        os.kill(pid1, signal.SIGTERM)
        job.wait()
    out = job.output
    assert "incident 1 (stall, raised by rank 1): hang; culprits: rank 0" in out, out[-6000:]
    assert "raises incident 2" not in out, out[-6000:]
    assert "received SIGTERM (during incident 1): the job is ending; no new incident" in out
    assert len(list((tmp_path / "out").glob("fr-otel-spool-*.jsonl"))) == 1
    assert "exitcode  : -15" in out  # rank 1 still died of SIGTERM, once its part was done
