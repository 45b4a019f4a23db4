"""Node leaders in real gloo jobs: a leader carries its node's ranks, and a frozen leader is replaced by the store.

Four ranks on one host under torchrun with ``FR_OTEL_NODE_LEADERS=on`` (one node: local rank 0
leads). While the leader polls, its ranks talk to no store at all; at an incident they leave
their payloads in the node folder and the leader sends one summary. A leader that freezes
(SIGSTOP) leaves a board that stops changing: its ranks go back to the job's store on their own,
raise the incident and name it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time
from pathlib import Path

import pytest
from support.jobs import Job, job_env, torchrun

from fr_otel.testing.otlp import OtlpGrpcReceiver, ReceivedSpan, wait_for

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
]

WS = 4


def _root(rx: OtlpGrpcReceiver) -> ReceivedSpan | None:
    return next((s for s in rx.spans() if s.span.name == "fr_otel.incident"), None)


def test_a_node_leader_sends_its_ranks_recorders_in_one_summary_that_names_the_stalled_rank(
        tmp_path: Path, jobs: list[Job]) -> None:
    """Rank 2 stalls: its peers wait, the incident's recorders travel in the leader's one summary, the trace names rank 2, and the job ends normally.
    The job signs its records (FR_OTEL_JOB_SECRET): the store's and the node board's alike verify, none is said
    forged."""
    with OtlpGrpcReceiver() as rx:
        env = job_env(tmp_path, TRAIN_LOOP_AGENT="early", TRAIN_LOOP_STALL_RANK="2", TRAIN_LOOP_STALL_STEP="20",
                      TRAIN_LOOP_STALL_SECONDS="25", TRAIN_LOOP_STEPS="24", TRAIN_LOOP_GLOO_TIMEOUT="60",
                      FR_OTEL_NODE_LEADERS="on", FR_OTEL_STALL_SECONDS="4", FR_OTEL_METRICS_PORT="off",
                      FR_OTEL_POLL_INTERVAL="1", OTEL_EXPORTER_OTLP_ENDPOINT=rx.url,
                      FR_OTEL_JOB_SECRET="0123456789abcdef" * 4)
        # polls at the shipped 1 s (job_env's 0.5 s makes "stale" 1.5 s, which a loaded 2-core box's pause of
        # the leader reaches: its ranks then rightly go to the store for a while, which is not what this holds)
        job = Job(torchrun(WS), env, tmp_path)
        jobs.append(job)
        assert wait_for(lambda: _root(rx) is not None, timeout=90, interval=0.2), job.output[-4000:]
        root = _root(rx)
        assert root is not None
        assert root.attributes["fr_otel.verdict"] == "hang" and root.attributes["fr_otel.culprit_ranks"] == [2]
        assert job.wait() == 0, job.output[-4000:]
    out = job.output
    assert "this node's summary sent (4 ranks" in out, out[-4000:]
    assert "without this job's signature" not in out and "unauthenticated" not in out, out[-4000:]
    assert out.count("this rank leads its node's agents") == 1  # said once, by the node's leader
    assert "keeps in touch with the job's store itself" not in out  # the leader polled throughout
    boards = list((tmp_path / "node").rglob("board"))
    assert boards == []  # the leader removed its node's folder at exit


def test_ranks_of_a_frozen_leader_go_back_to_the_store_raise_the_incident_and_name_the_leader(
        tmp_path: Path, jobs: list[Job]) -> None:
    """Local rank 0 (the leader) is frozen at step 20: ranks 1-3 notice its board stop, keep in touch with the store themselves, and the incident names rank 0.
    The job has no secret: the node's first rank says once that its store records are unauthenticated."""
    with OtlpGrpcReceiver() as rx:
        env = job_env(tmp_path, TRAIN_LOOP_AGENT="early", TRAIN_LOOP_STEPS="400", TRAIN_LOOP_GLOO_TIMEOUT="90",
                      FR_OTEL_NODE_LEADERS="on", FR_OTEL_STALL_SECONDS="4", FR_OTEL_METRICS_PORT="off",
                      OTEL_EXPORTER_OTLP_ENDPOINT=rx.url)
        job = Job(torchrun(WS), env, tmp_path)
        jobs.append(job)
        markers = tmp_path / "markers"

        def at_step(n: int) -> bool:
            try:
                return json.loads((markers / "step_rank_0").read_text())["step"] >= n
            except (OSError, ValueError):
                return False

        assert wait_for(lambda: at_step(20) or job.proc.poll() is not None, timeout=90, interval=0.05), job.output[-4000:]
        leader = int((markers / "pid_rank_0").read_text())
        os.kill(leader, signal.SIGSTOP)
        frozen = time.time()
        try:
            assert wait_for(lambda: _root(rx) is not None, timeout=60, interval=0.2), job.output[-4000:]
            arrived = time.time()
            root = _root(rx)
            assert root is not None
            assert root.attributes["fr_otel.verdict"] == "hang" and root.attributes["fr_otel.culprit_ranks"] == [0]
            assert arrived - frozen < 30
        finally:
            os.kill(leader, signal.SIGCONT)
    out = job.output
    back = {r for r in range(WS) if f"rank {r} keeps in touch with the job's store itself" in out}
    assert back == {1, 2, 3}, out[-4000:]  # (a loaded machine may make them say it more than once)
    assert out.count("store records are unauthenticated") == 1, out[-4000:]  # no secret: said once, by local rank 0
