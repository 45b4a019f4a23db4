"""The test kit's training loop: the markers, stacks and faults the multi-host lab works with."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fr_otel.testing.otlp import wait_for
from fr_otel.common.ports import unused_tcp_port

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
]

TRAIN_LOOP = Path(importlib.util.find_spec("support.train_loop").origin)  # type: ignore[union-attr,arg-type]


def test_a_stalled_rank_prints_its_stack_on_sigusr1_then_a_rank_told_to_exit_leaves_at_its_step(
        tmp_path: Path) -> None:
    """SIGUSR1 prints the stall's frame in main and the rank goes on; EXIT_RANK/STEP is os._exit(3) there, no hook."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "OTEL_", "TRAIN_LOOP_"))}
    env.update(OMP_NUM_THREADS="1", RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",  # one rank, no torchrun
               MASTER_PORT=str(unused_tcp_port()), GLOO_SOCKET_IFNAME="lo", TRAIN_LOOP_MARKERS=str(tmp_path),
               TRAIN_LOOP_STALL_RANK="0", TRAIN_LOOP_STALL_STEP="1", TRAIN_LOOP_STALL_SECONDS="4",
               TRAIN_LOOP_EXIT_RANK="0", TRAIN_LOOP_EXIT_STEP="3", TRAIN_LOOP_STEPS="10")
    err = tmp_path / "stderr"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, str(TRAIN_LOOP)], env=env, stderr=stderr)
    try:
        assert wait_for(lambda: (tmp_path / "stall_start.json").exists() or proc.poll() is not None, timeout=120)
        proc.send_signal(signal.SIGUSR1)
        code = proc.wait(60)
    finally:
        proc.kill()
        proc.wait()
    text = err.read_text()
    assert "Current thread" in text and 'train_loop.py", line' in text and " in main" in text, text
    assert code == 3, text
    step = json.loads((tmp_path / "step_rank_0").read_text())
    assert step["step"] == 3 and step["host"] == os.uname().nodename and step["time"] > 0
    assert not (tmp_path / "done_rank_0").exists()
    assert "Traceback" not in text
