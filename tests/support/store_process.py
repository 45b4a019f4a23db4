"""A job's TCPStore server in a process of its own, so a test can freeze it (SIGSTOP) as a lost host would be."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fr_otel.common.ports import unused_tcp_port


def freeze(server: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGSTOP ``server`` and return once it shows stopped: the signal is delivered when the kernel gets to it,
    and a store call made before that is answered (a loaded box once let a "frozen" store answer the leader)."""
    from support.lab import process_state

    os.kill(server.pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while process_state(server.pid) not in ("T", "t") and time.monotonic() < deadline:
        time.sleep(0.005)
    assert process_state(server.pid) in ("T", "t"), f"store server {server.pid}: {process_state(server.pid)!r}"


@contextmanager
def store_process() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """(port, process) of a TCPStore server on loopback, ready; thawed and killed on the way out."""
    port = unused_tcp_port()
    server = subprocess.Popen(
        [sys.executable, "-c", "import datetime, time, torch.distributed as d\n"
         f"s = d.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False,"
         " timeout=datetime.timedelta(seconds=30))\nprint('ready', flush=True)\ntime.sleep(120)"],
        stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        yield port, server
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()
