"""Incidents' owner records (what a raiser writes, how the log says it) and what the job's store says,
trusted no further than the job's shape: its forgeries said once each.

The TCPStore has no authentication: anything that reaches its port can write any key, and a
key an earlier run of the same job left behind looks the same. So an owner record of an
incident is checked for what a raiser of this job writes (:func:`owner_problem`), and each kind
of forgery costs one log line for the job's life (:class:`Forgeries`), never one per key.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from ...common.json_types import is_exact_int
from ...common.log import logger
from ..observe.poller import Stall

__all__ = ["FUTURE_SLACK_S", "Forgeries", "IncidentMarks", "describe_owner", "owner_problem", "stall_detail"]

#: An owner record dated this far ahead of this host's clock is not a raiser's (hosts' clocks differ by less).
FUTURE_SLACK_S = 300.0

log = logger("fr_otel.agent")


class IncidentMarks(Protocol):
    """What the store says of an incident beyond its owner record (the channel says it)."""

    def concluded(self, k: int) -> bool: ...

    def raised_by(self, k: int, meta: dict[str, Any]) -> bool: ...


class Forgeries:
    """Says once per kind that the store holds what no agent of this job wrote (or an earlier run's leftover)."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def __call__(self, kind: str, detail: str) -> None:
        if kind in self.said:
            return
        self.said.add(kind)
        log.warning("the job's store holds a forged or stale %s (%s): ignored; anything that reaches the store's "
                    "port can write it", kind, detail)


def owner_problem(k: int, meta: dict[str, Any], rank: int, world_size: int, channel: IncidentMarks | None = None,
                  now_ns: int | None = None) -> tuple[str, str] | None:
    """(kind, detail) when incident ``k``'s owner record ``meta``, as rank ``rank`` reads it, is none a
    raiser of this job wrote: not its shape, a rank outside the job, this very rank (which would know),
    dated ahead of this host's clock, or (asking ``channel``'s store) without its raiser's mark
    (:meth:`~.channel.IncidentChannel.claim`); kind "" when it is concluded already (an earlier run's:
    not joined, not a forgery). None: join it."""
    raiser, when = meta.get("rank"), meta.get("time_ns")
    now_ns = time.time_ns() if now_ns is None else now_ns
    if not (is_exact_int(raiser) and is_exact_int(when) and isinstance(meta.get("reason"), str)):
        return "incident owner record", f"i/{k}/owner is not a raiser's record"
    if not 0 <= raiser < world_size:
        return "incident owner naming a rank outside the job", f"i/{k}/owner names rank {raiser} of {world_size}"
    if raiser == rank:
        return "incident owner naming this rank", f"i/{k}/owner names rank {raiser}, which raised no such incident"
    if when > now_ns + FUTURE_SLACK_S * 1e9:
        return "incident owner from the future", f"i/{k}/owner is dated {(when - now_ns) / 1e9:.0f} s ahead of this clock"
    if channel is not None and channel.concluded(k):
        return "", "concluded"
    if channel is not None and not channel.raised_by(k, meta):
        return "incident owner without its raiser's mark", f"i/{k}/owner: rank {raiser} left no mark for it"
    return None


def stall_detail(fresh: list[Stall]) -> dict[str, Any]:
    """The incident's detection record for the oldest of ``fresh`` stalls."""
    s = max(fresh, key=lambda s: s.age_s)
    g = s.group
    return {"pg_name": g.name, "pg_desc": g.desc, "seq": g.inflight_seq, "op": g.op, "age_s": round(s.age_s, 3),
            "threshold_s": round(s.threshold_s, 3)}


def describe_owner(meta: dict[str, Any]) -> str:
    """An incident's owner record as a sentence for the log."""
    if "pg_name" in meta:
        return (f"{meta.get('op') or 'collective'} #{meta.get('seq')} on group {meta.get('pg_name')} "
                f"({meta.get('pg_desc', '')}) in flight {meta.get('age_s')} s (threshold {meta.get('threshold_s')} s)")
    return str(meta.get("reason", ""))
