"""Free loopback ports, the one way the test kit finds them: one, or a block of consecutive ones."""

from __future__ import annotations

import socket

__all__ = ["unused_tcp_port", "free_port_block"]


def unused_tcp_port() -> int:
    """A loopback port nothing listens on right now: for a server to take, or a "collector down" endpoint."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_block(n: int, *, tries: int = 100) -> int:
    """A base port with ``n`` consecutive free loopback ports from it (agents serve base + LOCAL_RANK)."""
    for _ in range(tries):
        base = unused_tcp_port()
        if base + n > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no block of {n} consecutive free loopback ports found")
