"""Who holds a group up without hanging it: the ranks that wait least while their peers wait long.

Every member of a process group runs the same collectives and waits in each until the last
member arrives. A slow rank (a throttled CPU, a thermal-capped GPU, a flapping link) arrives
last, so it waits least, while its peers wait for it. Per group, a rank's **lateness** is the
share of its recent time the group's typical member (the median, the rank included) spends
waiting in the group's collectives, minus the share the rank spends itself: the share of the
group's time spent waiting for it. A rank is **slow** when its lateness is at least
:data:`LATENESS_MIN` and it completed collectives in the window (a hang is not slowness: the
stall rules name that). Ranks that merely wait have a lateness of zero or less and are never
named, and a group with a collective in flight for long within the window stalled (a hang, or one
hold-up such as a checkpoint), it is not slow. A **host** is slow in a group when every one of its
ranks there is.

Lateness, not "waits far less than its peers" as a ratio: where collectives run on the CPU
(gloo), a throttled host slows its own part of every collective too, so its ranks still spend
much of their time in flight (measured in the lab: peers 83 %, the host throttled to 5 % of a CPU
56-63 %, its ranks arriving ~100 ms late per collective); what stays is the difference. A slow
majority is the norm, not a culprit: when most of a group is slow, nobody is named.

The live rules say the same in PromQL (``deploy/prometheus/fr-otel-rules.yml``: the
``threshold:fr_slow_rank_lateness:ratio`` rule is :data:`LATENESS_MIN`; a test ties them); the
agent applies this module to what every rank publishes (:mod:`fr_otel.agent.slow_watch`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["LATENESS_MIN", "Holdup", "RankWait", "holdups"]

#: The group's typical member waits at least this much more of its time than the rank does
#: (healthy jitter in the lab: under 0.07 over a 30 s window).
LATENESS_MIN = 0.1


@dataclass(frozen=True, slots=True)
class RankWait:
    """One rank's recent waiting in one group, as it measured it."""

    rank: int
    host: str
    pg_name: str
    pg_desc: str
    share: float  # of its recent time spent waiting in the group's collectives
    per_collective_s: float | None  # seconds waited per collective completed (None: none completed)
    completed: int  # collectives completed in the window
    in_flight_s: float = 0.0  # the longest one of its collectives in the group was in flight in the window


@dataclass(frozen=True, slots=True)
class Holdup:
    """Ranks that hold a group up: every rank of one host in the group (``whole_host``), or one rank."""

    host: str
    ranks: tuple[int, ...]
    pg_name: str
    pg_desc: str
    whole_host: bool
    lateness: float  # the smallest of its ranks': the share of the group's time spent waiting for them
    share: float  # the largest share of their time its ranks wait
    median_share: float  # the group's typical member's
    wait_s: float | None  # the longest wait per collective of its ranks
    peers_wait_s: float | None  # the median wait per collective of the group's other members

    @property
    def key(self) -> tuple[str, str]:
        """What stays the same while the same holdup goes on: (host or rank, group)."""
        return (self.host if self.whole_host else f"rank {self.ranks[0]}", self.pg_name)


def _slow(w: RankWait, median: float) -> bool:
    return w.completed > 0 and median - w.share >= LATENESS_MIN


def holdups(waits: Iterable[RankWait], stalled_after_s: float = math.inf) -> list[Holdup]:
    """Per group, its slow hosts (every rank of the host there slow) and the slow ranks on other hosts.
    A group where a member's collective was in flight ``stalled_after_s`` within the window stalled
    (a hang, whose window still holds the completions from before it; or one hold-up, a
    checkpoint written by one rank), it is not slow."""
    groups: dict[str, list[RankWait]] = {}
    for w in waits:
        groups.setdefault(w.pg_name, []).append(w)
    out: list[Holdup] = []
    for members in groups.values():
        if any(w.in_flight_s >= stalled_after_s for w in members):
            continue
        median = statistics.median(w.share for w in members)
        slow = [w for w in members if _slow(w, median)]
        if not slow:
            continue
        slow_ranks = {w.rank for w in slow}
        peers = [w.per_collective_s for w in members if w.rank not in slow_ranks and w.per_collective_s is not None]
        peers_wait = statistics.median(peers) if peers else None
        hosts: dict[str, list[RankWait]] = {}
        for w in members:
            hosts.setdefault(w.host, []).append(w)
        for host, on_host in sorted(hosts.items()):
            late = sorted((w for w in on_host if w.rank in slow_ranks), key=lambda w: w.rank)
            whole = bool(host) and len(late) == len(on_host)
            for part in ([late] if whole else [[w] for w in late]):
                waits_s = [w.per_collective_s for w in part if w.per_collective_s is not None]
                out.append(Holdup(host, tuple(w.rank for w in part), part[0].pg_name, part[0].pg_desc, whole,
                                  min(median - w.share for w in part), max(w.share for w in part), median,
                                  max(waits_s) if waits_s else None, peers_wait))
    return out
