"""Incidents' owner records and what the job's store says, trusted no further than the job's shape: its
forgeries said once each.

The TCPStore has no authentication: anything that reaches its port can write any key, and a
key an earlier run of the same job left behind looks the same. So an owner record of an
incident is checked for what a raiser of this job writes (:func:`owner_problem`), and each kind
of forgery costs one log line for the job's life (:class:`Forgeries`), never one per key.
"""

from __future__ import annotations

import time
from typing import Protocol

from ...common.log import logger
from ...incident.trigger import Trigger

__all__ = ["FUTURE_SLACK_S", "Forgeries", "IncidentMarks", "owner_problem"]

#: An owner record dated this far ahead of this host's clock is not a raiser's (hosts' clocks differ by less).
FUTURE_SLACK_S = 300.0

log = logger("fr_otel.agent")


class IncidentMarks(Protocol):
    """What the store says of an incident beyond its owner record (the channel says it)."""

    def concluded(self, k: int) -> bool: ...

    def raised_by(self, trigger: Trigger) -> bool: ...


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


def owner_problem(trigger: Trigger, rank: int, world_size: int, channel: IncidentMarks | None = None,
                  now_ns: int | None = None) -> tuple[str, str] | None:
    """(kind, detail) when an incident's owner record (read as ``trigger``: it has a raiser, a time and a
    reason, :meth:`~fr_otel.incident.trigger.Trigger.from_record`), as rank ``rank`` reads it, is none a raiser of
    this job wrote: a rank outside the job, this very rank (which would know), dated ahead of this host's clock,
    or (asking ``channel``'s store) without its raiser's mark (:meth:`~.channel.IncidentChannel.claim`); kind ""
    when it is concluded already (an earlier run's: not joined, not a forgery). None: join it."""
    k, raiser, when = trigger.number, trigger.raised_by, trigger.time_ns
    now_ns = time.time_ns() if now_ns is None else now_ns
    if not 0 <= raiser < world_size:
        return "incident owner naming a rank outside the job", f"i/{k}/owner names rank {raiser} of {world_size}"
    if raiser == rank:
        return "incident owner naming this rank", f"i/{k}/owner names rank {raiser}, which raised no such incident"
    if when > now_ns + FUTURE_SLACK_S * 1e9:
        return "incident owner from the future", f"i/{k}/owner is dated {(when - now_ns) / 1e9:.0f} s ahead of this clock"
    if channel is not None and channel.concluded(k):
        return "", "concluded"
    if channel is not None and not channel.raised_by(trigger):
        return "incident owner without its raiser's mark", f"i/{k}/owner: rank {raiser} left no mark for it"
    return None
