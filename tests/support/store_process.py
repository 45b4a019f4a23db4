"""A job's TCPStore server in a process of its own, so a test can freeze it (SIGSTOP) as a lost host would be."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from fr_otel.common.ports import unused_tcp_port


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
