"""``ranks.json``: the host map — which host, node, process and local rank each rank runs as.

Dump files say nothing about where they came from (unless the host is in their name), and a
rank whose node is lost writes none at all. So the live agent writes this map beside the
dumps at start-up, on every node, and again at incident time; ``fr-otel watch`` adds the
hosts it can vouch for (never replacing one the agent wrote); reading the folder picks it up
(:mod:`.sidecars`). Shape::

    {"version": 1, "world_size": 6,
     "ranks": {"2": {"host": "node1", "node": "gpu-017", "pid": 4242, "local_rank": 0,
                     "last_heard_ns": 1764590462500000000, "last_step": 12}, ...}}

``last_heard_ns`` (written at incident time) is when the rank last reached the job's store (itself
or through its node's leader): for a rank that left no dump, when it went silent; ``last_step``
the training step it was in then.

The file is untrusted input like the dumps: it is read by :mod:`.side_files`, only
well-typed values and real host names are kept, and a bad file costs one problem line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..common.files import atomic_write
from ..common.names import host_name
from .rank_process import RankProcess, bad_names, process_from_raw
from .side_files import per_rank, read_side_file

__all__ = ["RANKS_FILE", "HostMap", "add_hosts", "host_map_json", "per_rank_processes", "read_host_map",
           "read_rank_map", "write_host_map"]

T = TypeVar("T")

#: Its name ends in no rank number, so the reader never takes it for a dump.
RANKS_FILE = "ranks.json"
_CONSEQUENCE = "hosts from it unknown"
_MAX_WORLD = 1 << 24


@dataclass(slots=True)
class HostMap:
    """Where each rank runs, and the world size the map was written for (when it says)."""

    processes: dict[int, RankProcess] = field(default_factory=dict)
    world_size: int | None = None
    last_heard: dict[int, int] = field(default_factory=dict)  # rank -> wall clock ns it was last heard from
    last_step: dict[int, int] = field(default_factory=dict)  # rank -> its training step then
    store_host: str | None = None  # the host that runs the job's store (TCPStore), when known


def host_map_json(processes: dict[int, RankProcess], world_size: int | None = None,
                  last_heard: dict[int, int] | None = None, store_host: str | None = None,
                  last_step: dict[int, int] | None = None) -> dict[str, Any]:
    """The file's content (only the known fields of each rank)."""
    doc: dict[str, Any] = {"version": 1}
    if world_size:
        doc["world_size"] = world_size
    if store_host:
        doc["store_host"] = store_host
    heard, steps = last_heard or {}, last_step or {}
    ranks: dict[str, dict[str, Any]] = {}
    for rank in sorted(set(processes) | set(heard) | set(steps)):
        entry = processes[rank].as_json() if rank in processes else {}
        if rank in heard:
            entry["last_heard_ns"] = heard[rank]
        if rank in steps:
            entry["last_step"] = steps[rank]
        if entry:
            ranks[str(rank)] = entry
    doc["ranks"] = ranks
    return doc


def _heard(value: Any) -> int | None:
    ns = value.get("last_heard_ns") if isinstance(value, dict) else None
    return ns if type(ns) is int and 0 < ns < 1 << 63 else None


def _step(value: Any) -> int | None:
    step = value.get("last_step") if isinstance(value, dict) else None
    return step if type(step) is int and 0 <= step < 1 << 63 else None


def _parse(value: Any) -> RankProcess | None:
    return process_from_raw(value, RANKS_FILE)


def read_rank_map(path: str, problems: list[str]) -> dict[int, RankProcess]:
    """Rank -> :class:`RankProcess` from a ``ranks.json`` (read by :mod:`.side_files`); {} (and one
    line) when unusable; host names that are not host names are read as unknown (one line)."""
    host_map = read_host_map(path, problems)
    return host_map.processes if host_map is not None else {}


def read_host_map(path: str, problems: list[str]) -> HostMap | None:
    """The whole map, world size and last-heard times included; None (and one line) when unusable."""
    doc = read_side_file(path, problems, _CONSEQUENCE)
    if doc is None:
        return None
    world = doc.get("world_size")
    world_size = world if type(world) is int and 0 < world <= _MAX_WORLD else None
    seen: list[str] = []  # the ranks mapping is judged once, below
    heard = per_rank(path, doc, seen, _CONSEQUENCE, _heard)
    steps = per_rank(path, doc, seen, _CONSEQUENCE, _step)
    return HostMap(per_rank_processes(path, doc, problems, _CONSEQUENCE, _parse), world_size, heard, steps,
                   host_name(doc.get("store_host")))


def per_rank_processes(path: str, doc: dict[str, Any] | None, problems: list[str], consequence: str,
                       parse: Callable[[Any], T | None]) -> dict[int, T]:
    """:func:`.side_files.per_rank` for entries that name hosts (``ranks.json``):
    a ``host`` or ``node`` that is not a host name (``node7 $(touch x)``) costs one line in all."""
    bad = 0

    def counted(value: Any) -> T | None:
        nonlocal bad
        bad += bad_names(value)
        return parse(value)

    out = per_rank(path, doc, problems, consequence, counted)
    if bad:
        problems.append(f"{path}: {bad} host or node name{'s' if bad > 1 else ''} that {'are' if bad > 1 else 'is'} "
                        "not a host name (letters, digits, '.', '-', '_') read as unknown")
    return out


def add_hosts(known: dict[int, RankProcess], hosts: dict[int, str], source: str) -> dict[int, RankProcess]:
    """``known`` with each rank's host from ``hosts`` where it has none; a host already there
    (the agent's, from the rank itself) is never replaced. Returns only the ranks that changed."""
    out: dict[int, RankProcess] = {}
    for rank, host in hosts.items():
        was = known.get(rank)
        if was is None:
            out[rank] = RankProcess(host=host, source=source)
        elif was.host is None:
            out[rank] = replace(was, host=host)
    return out


def write_host_map(folder: str | os.PathLike[str], processes: dict[int, RankProcess],
                   world_size: int | None = None, last_heard: dict[int, int] | None = None,
                   store_host: str | None = None, last_step: dict[int, int] | None = None) -> Path | None:
    """Write ``folder/ranks.json`` all at once, keeping what an existing map says about ranks
    ``processes`` does not name (several nodes write the same folder). An existing map that
    cannot be read is left alone (None: it may be newer than this reader); raises OSError. A link
    planted in its place is never read: it is replaced, its target untouched."""
    path = Path(folder) / RANKS_FILE
    merged = dict(processes)
    if path.is_file() and not path.is_symlink():
        seen: list[str] = []
        old = read_host_map(str(path), seen)
        if old is None or seen:
            return None
        for rank, process in old.processes.items():
            merged.setdefault(rank, process)
        world_size = world_size or old.world_size
        last_heard = {**old.last_heard, **(last_heard or {})}
        last_step = {**old.last_step, **(last_step or {})}
        store_host = store_host or old.store_host
    doc = host_map_json(merged, world_size, last_heard, store_host, last_step)
    atomic_write(path, json.dumps(doc).encode("utf-8"), mkdir=True)
    return path
