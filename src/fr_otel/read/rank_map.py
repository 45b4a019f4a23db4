"""``ranks.json``: which host, process and local rank each rank ran as, written beside the dumps.

Dump files say nothing about where they came from (unless the host is in their name), so
the live agent's incident coordinator writes this map next to the dumps it collected,
``fr-otel watch`` adds the hosts it can vouch for (never replacing one the agent wrote), and
``fr-otel analyze`` of that folder reads it back. Shape::

    {"version": 1, "ranks": {"2": {"host": "node02", "node": "gpu-017", "pid": 4242, "local_rank": 2}, ...}}

The file is untrusted input like the dumps: it is read by :mod:`.side_files`, only
well-typed values and real host names are kept, and a bad file costs one problem line.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..common.files import atomic_write
from .rank_process import RankProcess, bad_names, process_from_raw
from .side_files import per_rank, read_side_file

__all__ = ["RANKS_FILE", "add_hosts", "per_rank_processes", "read_rank_map", "rank_map_json", "write_rank_map"]

T = TypeVar("T")

#: Its name ends in no rank number, so the reader never takes it for a dump.
RANKS_FILE = "ranks.json"


def rank_map_json(processes: dict[int, RankProcess]) -> dict[str, Any]:
    """The file's content (only the known fields of each rank)."""
    return {"version": 1, "ranks": {str(r): p.as_json() for r, p in sorted(processes.items()) if p.known}}


def read_rank_map(path: str, problems: list[str]) -> dict[int, RankProcess]:
    """Rank -> :class:`RankProcess` from a ``ranks.json`` (read by :mod:`.side_files`); {} (and one
    line) when unusable; host names that are not host names are read as unknown (one line)."""
    return per_rank_processes(path, read_side_file(path, problems, "hosts from it unknown"), problems,
                              "hosts from it unknown", lambda v: process_from_raw(v, RANKS_FILE))


def per_rank_processes(path: str, doc: dict[str, Any] | None, problems: list[str], consequence: str,
                       parse: Callable[[Any], T | None]) -> dict[int, T]:
    """:func:`.side_files.per_rank` for entries that name hosts (``ranks.json``, ``incident.json``):
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


def write_rank_map(folder: str | os.PathLike[str], processes: dict[int, RankProcess]) -> Path:
    """Write ``folder/ranks.json`` all at once (temp file, then rename); raises OSError."""
    path = Path(folder) / RANKS_FILE
    atomic_write(path, json.dumps(rank_map_json(processes)).encode("utf-8"))
    return path
