"""Inflating zlib data from others (payloads, node summaries in the store) with a bound.

A few KB of zlib can inflate to gigabytes: ``zlib.decompress`` would allocate them all before
anyone checks the size. Inflating at most the limit, then looking at what is left, costs no more
than the limit, whatever the sender wrote.
"""

from __future__ import annotations

import zlib

__all__ = ["InflatedTooLarge", "inflate"]


class InflatedTooLarge(ValueError):
    """The data inflates to more than its reader's limit."""


def inflate(data: bytes, limit: int) -> bytes:
    """``data`` inflated, at most ``limit`` bytes: :class:`InflatedTooLarge` beyond; ``zlib.error``
    when it is corrupt or cut short."""
    inflater = zlib.decompressobj()
    body = inflater.decompress(data, limit)
    if not inflater.eof:
        if inflater.decompress(inflater.unconsumed_tail, 1):  # one byte more: over the limit
            raise InflatedTooLarge(f"over {limit} bytes inflated")
        raise zlib.error("incomplete or truncated stream")
    return body
