"""Free loopback ports, the one way the test kit finds them: one, or a block of consecutive ones.

They live in :mod:`fr_otel.common.ports` (``fr-otel demo`` uses them too); this is their name in the test kit.
"""

from __future__ import annotations

from ..common.ports import free_port_block, unused_tcp_port

__all__ = ["free_port_block", "unused_tcp_port"]
