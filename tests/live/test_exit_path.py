"""The way out: the user's traceback first, then fr-otel's flush, within one budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.jobs import Job, job_env, torchrun

pytestmark = pytest.mark.gloo


def test_the_users_traceback_comes_before_the_agents_flush_even_when_torch_wraps_its_hook(
        tmp_path: Path, jobs: list[Job]) -> None:
    """The agent starts before init_process_group, so torch's excepthook wraps the agent's and holds back
    what it prints until it returns: the flush waits for atexit, the traceback is printed first."""
    env = job_env(tmp_path, TRAIN_LOOP_AGENT="early", TRAIN_LOOP_RAISE_RANK="1", TRAIN_LOOP_RAISE_STEP="3",
                  TRAIN_LOOP_GLOO_TIMEOUT="60", FR_OTEL_METRICS_PORT="off", FR_OTEL_STALL_SECONDS="100")
    job = Job(torchrun(2), env, tmp_path)
    jobs.append(job)
    assert job.wait() != 0
    out = job.output
    assert "[rank1]: RuntimeError: injected failure at step 3" in out, out[-3000:]
    assert "rank 1 raises incident 1" in out, out[-3000:]
    assert out.index("[rank1]: RuntimeError: injected failure at step 3") < out.index("rank 1 raises incident 1")
