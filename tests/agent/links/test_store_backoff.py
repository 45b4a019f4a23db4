"""A dead TCPStore costs the agent a few tries and one line, never a flood."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest


def test_store_backoff_doubles_up_to_the_cap_and_speaks_once(caplog: pytest.LogCaptureFixture) -> None:
    """After 3 failures: waits 2, 4, 8 ... 60 s between tries; one line when it starts, one when it ends."""
    from fr_otel.agent.links.store_link import StoreBackoff

    now = [0.0]
    backoff = StoreBackoff(threshold=3, base_s=2, cap_s=60, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="fr_otel.agent")
    tries = []
    while now[0] < 600:
        if backoff.allow():
            tries.append(now[0])
            backoff.failure(ConnectionResetError("gone"))
        now[0] += 1.0
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert gaps[:6] == [1, 1, 2, 4, 8, 16] and max(gaps) == 60 and len(tries) < 20
    backoff.success()
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 2 and "backing off" in msgs[0] and "answers again" in msgs[1]


@pytest.mark.skipif(sys.modules.get("torch") is None and __import__("importlib").util.find_spec("torch") is None,
                    reason="needs torch")
def test_a_dead_store_does_not_flood_stderr(tmp_path: Path) -> None:
    """Polling a TCPStore whose server is gone, once per 0.1 s for 4 s: a few tries, not one per poll."""
    script = tmp_path / "dead_store.py"
    script.write_text(
        "import sys, time, logging\n"
        "from datetime import timedelta\n"
        "import torch.distributed as dist\n"
        "from fr_otel.agent.links.channel import IncidentChannel\n"
        "from fr_otel.agent.links.store_link import StoreUnavailable\n"
        "from fr_otel.common.ports import unused_tcp_port\n"
        "logging.basicConfig(level=logging.WARNING, format='%(name)s: %(message)s')\n"
        "port = unused_tcp_port()\n"
        "server = dist.TCPStore('127.0.0.1', port, is_master=True, timeout=timedelta(seconds=2))\n"
        "client = dist.TCPStore('127.0.0.1', port, is_master=False, timeout=timedelta(seconds=1))\n"
        "channel = IncidentChannel(dist.PrefixStore('x/', client), 'test')\n"
        "del server\n"
        "calls = 0\n"
        "end = time.monotonic() + 4\n"
        "while time.monotonic() < end:\n"
        "    if channel.reachable():\n"
        "        calls += 1\n"
        "        try: channel.owner(1)\n"
        "        except StoreUnavailable: pass\n"
        "        except Exception: pass\n"
        "    time.sleep(0.1)\n"
        "print('CALLS', calls)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    calls = int(proc.stdout.split("CALLS")[1])
    assert calls <= 5, proc.stdout + proc.stderr[-2000:]
    assert proc.stderr.count("backing off") == 1
