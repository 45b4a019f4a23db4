"""Free loopback ports: one, or a block of consecutive ones (each rank serves ``base + LOCAL_RANK``).

``fr-otel demo`` gives its job's ranks a free block, as the suite's jobs do; a port is free when this process can bind it on 127.0.0.1 right now.
"""

from __future__ import annotations

import socket

__all__ = ["free_port_block", "ports_free", "unused_tcp_port"]


def unused_tcp_port() -> int:
    """A loopback port nothing listens on right now: for a server to take, or a "collector down" endpoint."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ports_free(base: int, n: int, *, reuse_address: bool = False) -> bool:
    """Whether ``base`` .. ``base + n - 1`` can all be bound on 127.0.0.1 now. ``reuse_address``: as
    a server that sets SO_REUSEADDR binds them (prometheus_client's does), so a port whose last
    connection is still in TIME_WAIT counts as free; one something listens on never does."""
    if base < 1 or base + n > 65536:
        return False
    socks: list[socket.socket] = []
    try:
        for port in range(base, base + n):
            sock = socket.socket()
            socks.append(sock)
            if reuse_address:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for sock in socks:
            sock.close()


def free_port_block(n: int, *, tries: int = 100) -> int:
    """A base port with ``n`` consecutive free loopback ports from it (agents serve base + LOCAL_RANK)."""
    for _ in range(tries):
        base = unused_tcp_port()
        if ports_free(base, n):
            return base
    raise RuntimeError(f"no block of {n} consecutive free loopback ports found")
