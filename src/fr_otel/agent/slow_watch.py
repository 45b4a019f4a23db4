"""The agent names the host that slows the whole job: one log line, before anything hangs.

Each rank measures only its own waits (:mod:`.observe.wait_sampler`); telling the slow rank from the
waiting ones needs everyone's. So every rank publishes a few bytes of its recent waits per
group to the job's store every :data:`PUBLISH_EVERY_S` (one bounded ``set``), and global rank 0
fetches them all as often (a ``check`` and a ``multi_get`` per 256 ranks) and applies the rule of
:mod:`fr_otel.diagnosis.lateness`, the one the Prometheus alerts apply. A holdup (a host whose
ranks all wait far less than their group, or one such rank) seen for :data:`LOG_AFTER_S` on one host
(its ranks may cross the threshold one comparison apart) gets one line::

    node1 (ranks 2-3) has held up default_pg (group 0) for 15 s: peers wait 0.55 s per all_reduce,
    it waits 0.01 s (92% and 2% of their time)

and, for the first :data:`MAX_INCIDENTS` holdups of a job, an incident (every rank's recorder,
the offline verdict, one trace: ``on_holdup``). Ranks that merely wait get no line. When the
holdup has not been seen for :data:`FORGET_AFTER_S`, one line says it ended.

Store load: N small ``set``s and 2N/256 round trips per interval, next to the N heartbeats per
second the incident channel already makes. With node leaders (:mod:`.links.node_leader`) a node's ranks
leave their waits in the node's folder and the leader sends them in the node's heartbeat: no
request of their own (0.2 a second per rank, 20,000 at 100k ranks, before); rank 0 reads the node
heartbeats (2 round trips per 256 nodes) and the keys of the ranks that publish on their own
(listed in ``w/who``: never a key that is not there). Every call is bounded (:mod:`.links.store_link`). Rank 0
spaces its comparisons to at least 200 times the last one's cost: at 16k ranks in 3 groups a
comparison takes ~0.4 s here, so rank 0 compares every ~80 s and spends 0.5 % of its time on it.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..common.ranks import compress_ranks
from ..diagnosis.lateness import Holdup, RankWait, holdups
from ..incident.trigger import Trigger
from .links.channel import IncidentChannel
from .incident.runner import IncidentRunner
from .observe.state import GroupStatus, GroupWait
from .observe.wait_sampler import WINDOW_S, WaitSampler, group_waits

if TYPE_CHECKING:
    from .links.node_leader import NodeRole

__all__ = ["FORGET_AFTER_S", "LOG_AFTER_S", "MAX_INCIDENTS", "PUBLISH_EVERY_S", "SlowWatch", "describe",
           "incident_for_holdups"]

log = logging.getLogger("fr_otel.agent")

#: How often each rank publishes its waits, and rank 0 compares them.
PUBLISH_EVERY_S = 5.0
#: A holdup seen this long (judged at every comparison since) gets its line.
LOG_AFTER_S = 15.0
#: A holdup not seen for this long has ended (a comparison that misses it once does not end it).
FORGET_AFTER_S = 30.0
#: Holdups per job that raise an incident (the job's incident budget is for hangs first).
MAX_INCIDENTS = 2
#: A window shorter than this (just after start) is not published: too few samples to compare.
_MIN_WINDOW_S = 10.0
_STALE_AFTER_S = 3 * PUBLISH_EVERY_S
#: Rank 0 compares at most once per this many times the last comparison's cost.
_COST_FACTOR = 200


class SlowWatch:
    """One rank's part: publish its waits; on the comparer (rank 0), judge everyone's and say so."""

    def __init__(self, channel: IncidentChannel, rank: int, world_size: int, host: str, *, comparer: bool,
                 stalled_after_s: float = math.inf, recent_op: Callable[[str], str | None] = lambda _: None,
                 on_holdup: Callable[[Holdup, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 timer: Callable[[], float] = time.perf_counter, node: NodeRole | None = None) -> None:
        self.channel = channel
        self.node = node
        self.rank = rank
        self.world_size = world_size
        self.host = host
        self.comparer = comparer
        #: A group with a collective in flight this long within the window stalled (the incidents'
        #: business, or a one-off hold-up: a checkpoint), it is not slow.
        self.stalled_after_s = stalled_after_s
        self._recent_op = recent_op
        self._on_holdup = on_holdup
        self._clock = clock
        self._wall = wall
        self._timer = timer
        self._next_publish = 0.0
        self._next_compare = clock() + PUBLISH_EVERY_S
        self._since: dict[tuple[str, str], float] = {}  # (host, group) held up -> when first seen
        self._seen: dict[tuple[str, str], float] = {}  # ... -> when last seen
        self._said: dict[tuple[str, str], set[int]] = {}  # ... -> the ranks its lines named
        self.incidents = 0
        self.compare_s = 0.0  # what the last comparison cost (fetch, decode, judge)
        self._ages: deque[tuple[float, dict[str, float]]] = deque()  # per poll: each group's in-flight age
        self._ops: dict[str, str | None] = {}  # group -> the op its collectives are, for the line

    def poll(self, sampler: WaitSampler, statuses: tuple[GroupStatus, ...]) -> None:
        """One poll's part (store errors propagate: the caller guards)."""
        now, wall = self._clock(), self._wall()
        self._ages.append((now, {g.name: g.age_s(int(wall * 1e9)) for g in statuses}))
        while self._ages and now - self._ages[0][0] > WINDOW_S:
            self._ages.popleft()
        if now >= self._next_publish:
            self._next_publish = now + PUBLISH_EVERY_S
            longest: dict[str, float] = {}
            for _, ages in self._ages:
                for name, age in ages.items():
                    longest[name] = max(longest.get(name, 0.0), age)
            summary = encode(group_waits(sampler, statuses), longest, self.host, wall)
            if summary is not None:
                self.publish(summary)
        if self.comparer and now >= self._next_compare:
            began = self._timer()
            try:
                self.judge(decode(self.everyone(), self._wall()), now)
            finally:  # at most ~0.5 % of rank 0's time (16k ranks x 3 groups: ~0.4 s a comparison)
                self.compare_s = self._timer() - began
                self._next_compare = now + max(PUBLISH_EVERY_S, _COST_FACTOR * self.compare_s)

    def publish(self, summary: dict[str, Any]) -> None:
        """Through this node's leader while it relays for this rank (its heartbeat carries it), else the store."""
        node = self.node
        if node is not None and node.leader:
            node.own_waits = summary
            return
        if node is not None and node.relayed():
            try:
                node.node.drop_waits(summary)
                return
            except OSError:  # the node folder cannot take it (full, gone): the store can
                pass
        self.channel.publish_waits(self.rank, summary)

    def everyone(self) -> dict[int, dict[str, Any]]:
        """Every rank's latest waits: those published one by one and those in the node heartbeats (the newer
        of the two where a rank has both: it went from one path to the other)."""
        raw: dict[int, dict[str, Any]] = {}
        for beat in self.channel.node_heartbeats(self.world_size).values():
            waits = beat.get("waits") if isinstance(beat, dict) else None
            for key, summary in waits.items() if isinstance(waits, dict) else ():
                rank = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 10 else -1
                if 0 <= rank < self.world_size and isinstance(summary, dict) and _newer(summary, raw.get(rank)):
                    raw[rank] = summary
        for rank, summary in self.channel.waits(self.world_size).items():
            if _newer(summary, raw.get(rank)):
                raw[rank] = summary
        return raw

    def judge(self, waits: list[RankWait], now: float) -> list[str]:
        """Compare everyone's waits; log (and return) a line for each holdup seen long enough, and
        for each one that ended. A holdup is counted by its place (its host, in its group), whoever of
        the host crosses the threshold at each comparison: a throttled host's ranks cross it one by one."""
        lines = []
        at: dict[tuple[str, str], list[Holdup]] = {}
        for h in holdups(waits, self.stalled_after_s):
            at.setdefault((h.host, h.pg_name) if h.host else h.key, []).append(h)
        for place, found in at.items():
            self._seen[place] = now
            since = self._since.setdefault(place, now)
            if now - since < LOG_AFTER_S:
                continue
            said = self._said.get(place)
            fresh = [h for h in found if said is None or not set(h.ranks) <= said]  # a rank of it not said yet
            if not fresh:
                continue
            self._said[place] = (said or set()).union(*(h.ranks for h in fresh))
            for h in fresh:
                if h.pg_name not in self._ops:  # one full read of this rank's recorder per group, ever
                    self._ops[h.pg_name] = self._recent_op(h.pg_name)
                line = describe(h, now - since, self._ops[h.pg_name])
                log.warning("%s", line)
                lines.append(line)
            if said is None and self._on_holdup is not None and self.incidents < MAX_INCIDENTS:
                self.incidents += 1  # one incident a place: its every rank's recorder goes into it
                self._on_holdup(fresh[0], lines[-len(fresh)])
        for place, seen in list(self._seen.items()):
            if now - seen < FORGET_AFTER_S:
                continue
            if place in self._said:
                line = f"{place[0]} no longer holds up group {place[1]} (it did for {seen - self._since[place]:.0f} s)"
                log.info("%s", line)
                lines.append(line)
            self._said.pop(place, None)
            del self._seen[place], self._since[place]
        return lines


def incident_for_holdups(runner: IncidentRunner) -> Callable[[Holdup, str], None]:
    """Raise an incident for a holdup: every rank's recorder, the offline verdict, one trace."""
    def raise_one(h: Holdup, line: str) -> None:
        who = f"host {h.host}" if h.whole_host else f"rank {h.ranks[0]}"
        runner.raise_incident(Trigger.for_slow(who, h.pg_name, h.pg_desc, h.ranks, h.host, line,
                                               runner.me.config.stall_seconds))
    return raise_one


def describe(h: Holdup, held_s: float, op: str | None) -> str:
    """The line: who, which group, how long, and what everyone waits."""
    who = (f"{h.host} ({'rank' if len(h.ranks) == 1 else 'ranks'} {compress_ranks(h.ranks)})" if h.whole_host
           else f"rank {h.ranks[0]} ({h.host or 'host unknown'})")
    group = f"{h.pg_desc} (group {h.pg_name})" if h.pg_desc else f"group {h.pg_name}"
    shares = f"{h.median_share:.0%} and {h.share:.0%} of their time"
    if h.peers_wait_s is None or h.wait_s is None:
        return (f"{who} has held up {group} for {held_s:.0f} s: peers wait {h.median_share:.0%} of their time, "
                f"it waits {h.share:.0%}")
    return (f"{who} has held up {group} for {held_s:.0f} s: peers wait {h.peers_wait_s:.2f} s per "
            f"{op or 'collective'}, it waits {h.wait_s:.2f} s ({shares})")


def encode(waits: tuple[GroupWait, ...], ages: dict[str, float], host: str, wall_s: float) -> dict[str, Any] | None:
    """What a rank publishes: its host, the time, and per group its recent share, wait per
    collective, collectives completed and the longest a collective there was in flight in the
    window, as its polls saw it (None while the window is too short to compare)."""
    groups = [[w.name, w.desc, round(w.recent_share, 4),
               None if w.recent_wait_s is None else round(w.recent_wait_s, 4), w.recent_completed,
               round(ages.get(w.name, 0.0), 1)]
              for w in waits if w.recent_s >= _MIN_WINDOW_S]
    return {"t": round(wall_s, 1), "h": host, "g": groups} if groups else None


def _fresh_stamp(t: Any, wall_s: float) -> bool:
    """Published within the last few intervals, and not from the future (a stamp ahead of this clock
    would keep a rank that stopped publishing compared for good)."""
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return False
    try:
        return -PUBLISH_EVERY_S < wall_s - t < _STALE_AFTER_S
    except OverflowError:  # an int too large for a float
        return False


def _newer(summary: dict[str, Any], than: dict[str, Any] | None) -> bool:
    t, other = summary.get("t"), than.get("t") if than is not None else None
    if than is None:
        return True
    return isinstance(t, (int, float)) and (not isinstance(other, (int, float)) or t > other)


def decode(raw: dict[int, dict[str, Any]], wall_s: float) -> list[RankWait]:
    """Everyone's publications, fresh ones only (a rank that stopped publishing is not compared);
    anything malformed is skipped."""
    out = []
    for rank, d in raw.items():
        if not isinstance(d, dict) or not _fresh_stamp(d.get("t"), wall_s):
            continue
        host = d.get("h")
        host = host if isinstance(host, str) else ""
        groups = d.get("g")
        for g in groups if isinstance(groups, list) else ():
            try:
                name, desc, share, per, done, age = g
                share, age = float(share), float(age)
                per = None if per is None else float(per)
                if not (math.isfinite(share) and math.isfinite(age) and type(done) is int):
                    continue
                out.append(RankWait(rank, host, str(name), str(desc), share, per, done, age))
            except (TypeError, ValueError, OverflowError):
                continue
    return out
