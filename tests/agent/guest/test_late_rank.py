"""A process no rank variable announces gets its agent when, and only when, it calls init_process_group.

Each case is a fresh interpreter with `fr-otel run`'s environment (the bootstrap first on PYTHONPATH,
FR_OTEL_AUTOSTART=1) and no RANK, LOCAL_RANK or SLURM_PROCID, as Lightning's rank 0, a `ddp_spawn` child or an
mpirun rank starts.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from fr_otel.cli.run import BOOTSTRAP_DIR
from fr_otel.common.ports import unused_tcp_port

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the torch extra")


def _bootstrapped(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FR_OTEL_", "OTEL_")) and k not in ("RANK", "LOCAL_RANK", "SLURM_PROCID")}
    env.update(PYTHONPATH=os.pathsep.join([str(BOOTSTRAP_DIR), env.get("PYTHONPATH", "")]), FR_OTEL_AUTOSTART="1",
               FR_OTEL_METRICS_PORT="off", FR_OTEL_INCIDENTS="off", FR_OTEL_PG_WARN_SECONDS="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                          env=env, check=False)


def test_init_process_group_starts_the_agent_of_a_process_with_no_rank_variable() -> None:
    """The process's own init_process_group call (as Lightning makes it) starts the agent first, which then owns
    the process: its process group is the one the script made, its recorder sized before the group existed."""
    proc = _bootstrapped(f"""
        import os, sys, time
        import torch.distributed as dist
        print("fr_otel" in sys.modules, flush=True)
        os.environ.update(RANK="0", LOCAL_RANK="0")  # what Lightning sets in rank 0 before its call
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{unused_tcp_port()}", rank=0, world_size=1)
        import fr_otel.agent
        agent = fr_otel.agent.current()
        deadline = time.monotonic() + 20
        while agent is not None and agent.rank is None and time.monotonic() < deadline:
            time.sleep(0.05)
        print(agent is not None and agent.rank == 0, os.environ.get("FR_OTEL_AGENT_PID") == str(os.getpid()),
              agent.recorder_enabled if agent is not None else None)
        dist.destroy_process_group()
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True", "True", "True"], proc.stdout + proc.stderr


def test_a_process_that_never_calls_init_process_group_runs_no_agent_and_says_nothing() -> None:
    """A helper of the job that imports torch.distributed (a spawning parent, a data tool) never loads fr_otel:
    no agent, no thread, no warning about a process group that never comes."""
    proc = _bootstrapped("""
        import sys, threading, time
        import torch.distributed
        time.sleep(1.5)  # past FR_OTEL_PG_WARN_SECONDS
        print("fr_otel" in sys.modules, [t.name for t in threading.enumerate() if t.name.startswith("fr-otel")])
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "[]"], proc.stdout
    assert proc.stderr == "", proc.stderr
