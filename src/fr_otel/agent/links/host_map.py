"""The job's host map, known before anything goes wrong, and who is still heard from.

A node that is cut off, frozen or crashed writes no dump and answers no store call, so
where its ranks ran must be known beforehand. At start-up every rank says where it runs
(``host/<rank>`` in the store); each node's first local rank gathers the whole map once
every rank has said (bounded tries), keeps it, and writes it as ``ranks.json`` beside the
dumps on its node: in the agent's dump folder and in the folder the job's own dump setting
names (where NCCL's watchdog dumps land). An offline analysis of any node's dumps then
names the host of every rank, the lost ones included, and which host runs the job's store
(the ranks there say so: the store's address is one of their own).

Every poll also leaves a heartbeat (``hb/<rank>``: the wall clock of this poll and the rank's
training step), so an incident can say when, and at which step, each missing rank was last
heard from, and which node went silent first. With node leaders (:mod:`.node_leader`) the
leader beats for its whole node instead (the same facts per rank), and gathers the whole map at start only up to :data:`GATHER_MAX_WORLD` ranks (at 100k ranks,
12,500 leaders each reading 100k keys would be a billion reads): beyond it the coordinator
fetches the hosts it needs at an incident and its files bring the map to every node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ...common.log import logger
from ...read.rank_map import RANKS_FILE, read_host_map, write_host_map
from ...read.rank_process import RankProcess, bad_names, process_from_raw
from .channel import IncidentChannel
from .reachability import holds_address

__all__ = ["GATHER_MAX_WORLD", "GATHER_TRIES", "HostMapKeeper"]

log = logger("fr_otel.agent")

#: How many times a node leader looks for ranks that have not said where they run yet.
GATHER_TRIES = 12
#: Past this world size node leaders do not gather the whole map at start (see above).
GATHER_MAX_WORLD = 16384
_GATHER_EVERY_S = 5.0


class HostMapKeeper:
    """One rank's part in the host map: announce itself, beat, and (node leaders) gather and write it."""

    def __init__(self, channel: IncidentChannel, rank: int, world_size: int, process: RankProcess, *,
                 leader: bool, folders: Callable[[], list[Path]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.channel = channel
        self.rank = rank
        self.world_size = world_size
        self.leader = leader
        self._folders = folders
        self._clock = clock
        #: Where each rank runs, as far as this rank knows (itself at least).
        self.processes: dict[int, RankProcess] = {rank: process}
        #: The host that runs the job's store, once a rank there said so.
        self.store_host: str | None = None
        self._announced = False
        self._tries = 0
        self._next_try = 0.0

    @property
    def announced(self) -> bool:
        return self._announced

    @property
    def complete(self) -> bool:
        return len(self.processes) >= self.world_size

    def poll(self, now_ns: int, step: int | None = None, *, beat: bool = True) -> None:
        """One poll's store work: announce (once), heartbeat with the rank's training step ``step``
        (unless a node leader beats for this rank), and on a node leader gather the map until it is
        complete or the tries run out. Store errors propagate (the caller guards)."""
        self.announce()
        if beat:
            self.channel.heartbeat(self.rank, now_ns, step)
        if (self.leader and not self.complete and self._tries < GATHER_TRIES and self._clock() >= self._next_try
                and self.world_size <= GATHER_MAX_WORLD):
            self._tries += 1
            self._next_try = self._clock() + _GATHER_EVERY_S
            self.gather()
            if self.complete or self._tries == GATHER_TRIES:
                self.write()

    def announce(self) -> None:
        """Say where this rank runs (once: a store call only the first time)."""
        if self._announced:
            return
        me = self.processes[self.rank]
        store_host, _, _ = self.channel.address.rpartition(":")
        holds = bool(store_host) and holds_address(store_host)
        if holds:
            self.store_host = me.host
        self.channel.announce(self.rank, {**me.as_json(), **({"store": True} if holds else {})})
        self._announced = True

    def gather(self, ranks: list[int] | None = None) -> None:
        """Fetch where every rank (of ``ranks``) not known yet runs (one bounded round trip per 256 ranks)."""
        missing = [r for r in (range(self.world_size) if ranks is None else ranks) if r not in self.processes]
        for rank, raw in self.channel.hosts(missing).items():
            if bad_names(raw):
                self.channel.forged("host record", f"host/{rank} names a host that is no host name (read as unknown)")
            process = process_from_raw(raw, "agent")
            if process is not None:
                self.processes[rank] = process
                if raw.get("store") is True and process.host:
                    self.store_host = process.host

    def from_disk(self) -> None:
        """What this node's leader wrote (``ranks.json`` in the node's dump folder), for a rank that
        did not gather the map itself: no store call, so it works when the store is gone too."""
        if self.complete:
            return
        for folder in self._folders()[:1]:
            seen: list[str] = []
            found = read_host_map(str(folder / RANKS_FILE), seen) if (folder / RANKS_FILE).is_file() else None
            if found is None:
                continue
            for rank, process in found.processes.items():
                self.processes.setdefault(rank, process)
            self.store_host = self.store_host or found.store_host

    def write(self) -> None:
        """``ranks.json`` in every folder this node's dumps go to; a folder that cannot be written is a log line."""
        for folder in self._folders():
            try:
                write_host_map(folder, dict(self.processes), self.world_size, store_host=self.store_host)
            except OSError as exc:
                log.warning("cannot write the host map into %s (%s): an offline analysis of dumps there will not "
                            "know where lost ranks ran", folder, exc.strerror or exc)
        if not self.complete:
            absent = self.world_size - len(self.processes)
            log.info("host map written without %d rank(s) that never said where they run", absent)
