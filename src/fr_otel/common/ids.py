"""Deterministic trace and span ids: every rank, node and re-export computes the same ids alone.

Ids are blake2b hashes of stable keys (job identity, incident, rank, record), so ranks or nodes
exporting independently land in one trace, and re-exporting the same dumps yields identical ids.
An all-zero id (which backends drop) is never returned. Plain hashing, no OpenTelemetry: an
``incident.json`` is checked against the same rule when it is read.
"""

from __future__ import annotations

import hashlib

__all__ = ["hashed_id", "span_id_for", "trace_hex_for", "trace_id_for"]


def hashed_id(key: str, size: int) -> int:
    """A ``size``-byte id from a stable key: the same key gives the same id anywhere, never 0."""
    value = int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=size).digest(), "big")
    return value or 1


def trace_id_for(job_id: str, incident: str = "") -> int:
    """The 128-bit trace id of one incident of one job (run + restart)."""
    return hashed_id(f"fr-otel/trace\0{job_id}\0{incident}", 16)


def trace_hex_for(job_id: str, incident: str = "") -> str:
    """:func:`trace_id_for` as its 32 hex digits: the incident folder's name, the id people search for."""
    return f"{trace_id_for(job_id, incident):032x}"


def span_id_for(trace_id: int, *key: object) -> int:
    """A 64-bit span id, unique within the trace for a distinct ``key``."""
    return hashed_id(f"{trace_id:032x}\0" + "\0".join(map(str, key)), 8)
