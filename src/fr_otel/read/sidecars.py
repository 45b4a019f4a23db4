"""The files beside the dumps, and what they add to them: where every rank ran, its steps, the incident.

Dump files say neither where a rank ran nor its training step, and a rank whose node was
lost left no dump at all. The live agent and ``fr-otel watch`` therefore leave, beside the
dumps:

- ``ranks.json`` (:mod:`.rank_map`): each rank's host, node, pid and local rank, written by
  every node's agent at start-up (before anything can go wrong) and at incident time, so a
  rank with no dump still has a host;
- ``steps.json`` (:mod:`.steps`): each rank's training steps;
- ``incident.json`` (:mod:`.incident_file`): the live incident's identity, with each rank's
  host, threads' stacks at incident time, and the collectives its backend retired as failed.

Reading a folder reads them all, here and only here, so ``read_dumps`` gives every caller
(``fr-otel analyze``, the library API, ``watch``, the incident pipeline) the same job.
What a dump itself says always wins over a side file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .dump import RankDump
from .incident_file import INCIDENT_FILE, LIVE_INCIDENT_SOURCE, IncidentIdentity, find_identity
from .network import NetworkFacts
from .rank_map import RANKS_FILE, HostMap, read_host_map
from .rank_process import RankProcess
from .side_files import side_file_present
from .steps import STEPS_FILE, read_steps_file

__all__ = ["SIDECARS", "SideFacts", "read_sidecars", "sidecar_folders"]

#: Names of the side files: never dumps, even when named on the command line.
SIDECARS = (RANKS_FILE, STEPS_FILE, INCIDENT_FILE)


@dataclass(slots=True)
class SideFacts:
    """What the side files say beyond the dumps themselves."""

    #: rank -> where it ran, for every rank a side file names (ranks with no dump included).
    processes: dict[int, RankProcess] = field(default_factory=dict)
    #: The world size the host map was written for, when it says.
    world_size: int | None = None
    #: rank -> when it was last heard from (wall clock ns): for a rank with no dump, when it went silent.
    last_heard: dict[int, int] = field(default_factory=dict)
    #: rank -> its training step when it was last heard from (the step a lost rank was in).
    last_step: dict[int, int] = field(default_factory=dict)
    #: The live incident these dumps belong to (its incident.json), when there is one that fits them.
    identity: IncidentIdentity | None = None
    #: The job's store and the other hosts, as the node that analysed the incident saw them.
    network: NetworkFacts | None = None
    #: Every node's view of the network, when the folders of several nodes of the incident were read together.
    views: tuple[NetworkFacts, ...] = ()
    #: The host of the job's store (the host map says which rank's host holds it).
    store_host: str | None = None


def sidecar_folders(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The folders whose side files belong to ``paths`` (a folder, or the folder of a file)."""
    return sorted({Path(p) if Path(p).is_dir() else Path(p).parent for p in paths})


def read_sidecars(paths: Sequence[str | os.PathLike[str]], dumps: dict[int, RankDump],
                  problems: list[str]) -> SideFacts:
    """Read the side files beside ``paths``; fill in what ``dumps`` lack (steps, stacks at
    incident time) and return what concerns the job as a whole. Never raises."""
    facts = SideFacts()
    folders = sidecar_folders(paths)
    for folder in folders:
        host_map = _read_if_there(folder / RANKS_FILE, problems)
        if host_map is not None:
            for rank, process in host_map.processes.items():
                facts.processes.setdefault(rank, process)
            for rank, ns in host_map.last_heard.items():
                facts.last_heard.setdefault(rank, ns)
            for rank, step in host_map.last_step.items():
                facts.last_step.setdefault(rank, step)
            facts.world_size = facts.world_size or host_map.world_size
            facts.store_host = facts.store_host or host_map.store_host
        steps_path = folder / STEPS_FILE
        if side_file_present(str(steps_path)):  # a FIFO or a looping link is read too: its problem is said
            for rank, log in read_steps_file(str(steps_path), problems).items():
                dump = dumps.get(rank)
                if dump is not None and dump.steps is None:
                    dump.steps = log
    identity = find_identity(folders, problems)
    stale = identity.stale_for(dumps) if identity is not None else None
    if identity is not None and stale:
        problems.append(f"{identity.path}: {stale}; not using its trace id or stacks")
        identity = None
    if identity is not None:
        facts.identity = identity
        facts.network = identity.network
        facts.views = identity.views
        # The live incident wrote the ranks.json beside it: what it says of each rank is what the
        # agent knew at incident time (the report words a culprit's next step by that).
        facts.processes = {r: replace(p, source=LIVE_INCIDENT_SOURCE) if p.source == RANKS_FILE else p
                           for r, p in facts.processes.items()}
        for rank, now in identity.stacks.items():
            dump = dumps.get(rank)
            if dump is not None and dump.now is None:
                dump.now = now
        for rank, marks in identity.failed.items():
            dump = dumps.get(rank)
            if dump is not None:
                for mark in marks:
                    dump.mark_failed(mark)
    return facts


def _read_if_there(path: Path, problems: list[str]) -> HostMap | None:
    return read_host_map(str(path), problems) if side_file_present(str(path)) else None
