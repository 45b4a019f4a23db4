"""Fixtures of the agent's tests."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from fr_otel.common.ports import unused_tcp_port


@pytest.fixture
def port() -> Iterator[int]:
    """A real TCPStore server on loopback, its port (the server lives as long as the test)."""
    dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")
    port = unused_tcp_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    yield port
    del server
