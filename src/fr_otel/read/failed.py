"""Collectives the backend retired because they failed: recorded as completed, they never were.

gloo marks a collective that timed out (or whose peer closed the connection) as completed
(``retired``, ``last_completed_collective`` advanced), and NCCL retires what it aborts: a dump
taken after the watchdog fired shows nothing in flight, and the job would look healthy. The live
agent sees the failure (the exception the collective raised, or a stall it was watching that the
backend then retired) and says so beside the recorder: ``fr_otel_failed`` in its payload, and
per rank in ``incident.json``. Readers apply the marks (:meth:`fr_otel.read.dump.RankDump.mark_failed`),
so the collective counts as in flight everywhere: progress, waits, spans, the report.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..common.text import printable

__all__ = ["MAX_MARKS", "PAYLOAD_KEY", "FailedCollective", "failed_from_raw"]

#: Top-level key of a payload (and a rank's key in incident.json) with its failed collectives.
PAYLOAD_KEY = "fr_otel_failed"
#: Marks kept per rank: one failure ends a job; a few groups may fail together.
MAX_MARKS = 16
_MAX_REASON = 300


class FailedCollective(NamedTuple):
    """Collective #``seq`` of group ``group`` failed on this rank, for ``reason``."""

    group: str
    seq: int
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {"pg": self.group, "seq": self.seq, "reason": self.reason}


def failed_from_raw(value: Any) -> tuple[FailedCollective, ...]:
    """The marks in untrusted data (a payload, incident.json); ill-typed items are dropped."""
    out: list[FailedCollective] = []
    for item in value[:MAX_MARKS] if isinstance(value, list) else ():
        if not isinstance(item, dict):
            continue
        group, seq, reason = item.get("pg"), item.get("seq"), item.get("reason")
        if type(group) is str and type(seq) is int and 0 <= seq < 1 << 62:
            out.append(FailedCollective(printable(group)[:256], seq,
                                        printable(reason)[:_MAX_REASON] if type(reason) is str else ""))
    return tuple(out)
