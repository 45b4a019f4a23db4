"""The coordinator's gathering through the store: every live rank's recorder, and who is silent.

Waits, bounded, for the payload of every rank still heard from (a rank whose heartbeat is a few
polls old is presumed lost and not waited for: the verdict comes as soon as everyone alive has
sent theirs), takes the exit copies of ranks that ended earlier, and adds what the dumps cannot
say: where every rank runs (the host map), when each was last heard from, and which other hosts
this node can still reach. A store that stops answering mid-way raises
:class:`~.store_link.StoreUnavailable`: the coordinator then reports its own node's part without it
(:mod:`.local_incident`), with the heartbeats it read before.
"""

from __future__ import annotations

import time
from collections.abc import Collection

from ..common.ranks import compress_ranks
from ..read.reader import ReadResult
from .incident_rank import IncidentRank
from .payload import decode_payload

__all__ = ["SILENT_POLLS", "gather"]

#: A rank whose heartbeat is this many polls old when an incident is raised is presumed lost: not waited for.
SILENT_POLLS = 3
_GATHER_POLL_S = 0.05


def _alive(me: IncidentRank, heard: dict[int, int], expected: frozenset[int]) -> int:
    """How many ranks beat within the last few polls (this one counts: it is gathering), or are
    ``expected`` whatever their heartbeat says."""
    since = time.time_ns() - int(SILENT_POLLS * me.config.poll_interval * 1e9)
    return sum(1 for r in range(me.world_size) if heard.get(r, 0) >= since or r == me.rank or r in expected)


def gather(me: IncidentRank, k: int, deadline: float, expected: Collection[int] = ()) -> ReadResult:
    """Every rank's recorder for incident ``k`` that arrives in time (ranks that exited earlier
    left one at exit), decoded into the evidence the pipeline reads, with where every rank runs
    and when each was last heard from. Ranks silent for a few polls already (a lost node) are not
    waited for, and one that dies during the gathering stops being waited for once its heartbeat
    is that old: the verdict comes as soon as everyone still alive has sent theirs. ``expected``
    ranks are waited for (until the gathering's bound) however old their heartbeat: the ranks of a
    slow host that the incident is about, whose agents beat late because their CPU is throttled,
    and without whose recorders the verdict could not name them."""
    world = me.world_size
    ranks = list(range(world))
    problems: list[str] = []
    read = ReadResult(problems=problems)
    gather_until = min(time.monotonic() + me.config.gather_seconds, deadline)
    heard = me.channel.last_heard(ranks)
    checked = time.monotonic()
    wanted = frozenset(r for r in expected if 0 <= r < world)
    while me.channel.arrived(k) < _alive(me, heard, wanted) and time.monotonic() < gather_until:
        time.sleep(_GATHER_POLL_S)
        if time.monotonic() - checked >= me.config.poll_interval:  # a rank that dies now stops beating
            heard, checked = me.channel.last_heard(ranks), time.monotonic()
    payloads = me.channel.fetch(k, ranks)
    late = [r for r in ranks if r not in payloads]
    finals = me.channel.fetch_final(late) if late else {}
    me.hosts.from_disk()
    if any(r not in payloads and r not in finals and r not in me.hosts.processes for r in ranks):
        me.hosts.gather()
    for rank, payload in sorted({**finals, **payloads}.items()):
        source = f"rank {rank} ({'at its exit' if rank in finals and rank not in payloads else 'live'})"
        dump = decode_payload(payload, rank, source, problems)
        if dump is not None:
            read.dumps[rank] = dump
    gone = [r for r in ranks if r not in read.dumps]
    if gone:
        problems.append(f"rank(s) {compress_ranks(gone)} sent no recorder within {me.config.gather_seconds:g} s "
                        "(stuck with the GIL held, cut off, or dead)")
    read.side.processes = dict(me.hosts.processes)
    read.side.world_size = world
    read.side.last_heard = heard
    read.side.last_step = {r: s for r, s in me.channel.steps.items() if r in heard}  # their step at that beat
    read.side.store_host = me.hosts.store_host
    silent_hosts = {me.hosts.processes[r].host for r in gone if r in me.hosts.processes}
    read.side.network = me.network_now({h for h in silent_hosts if h})
    return read
