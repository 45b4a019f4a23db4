"""An incident with no store: when the job's store is lost, each node handles its own part of it.

If the host that runs the job's store is lost (or this node is cut off from it), no rank here can
raise or join an incident through the store. The ranks of this node still see the stall (their
collective does not finish) and still leave their recorders; they agree through the incident's
dump folder instead, which is on their own node:

- the incident's number is the next one after the last this rank saw through the store (every
  rank saw the same ones), so its trace id is the one a store-wide incident would have had: the
  nodes' parts land in one trace, each under its own root (``local/<host>``);
- each local rank writes its dump (torch's bytes) and its payload (``.rank_<r>.payload``: where
  it runs, its stacks now, its steps, its failed collectives) into
  ``<dump dir>/<trace id>/``;
- the store may also go *during* an incident raised through it (its host's ranks died of the same
  fault and took it along): every rank of the incident that sees a store call fail falls back to
  this, with the same number; a rank still waiting for the verdict finds out that way;
- the raiser coordinates its node (it read the heartbeats while the store answered: the verdict
  still says when each lost rank was last heard); on other nodes the first local rank to create
  ``.local_<host>.lock`` there does: it waits (bounded) for its node's ranks, adds what this node sees of the network (the store unanswered since when; which
  other hosts' agents still answer) and runs the incident pipeline, so this node's verdict, trace
  and files exist even though the job's store is gone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ...common.log import logger
from ...common.files import atomic_write, read_regular
from ...common.ids import trace_hex_for
from ...common.ranks import compress_ranks
from ...read.reader import ReadResult
from .rank import IncidentRank, dump_path
from ...incident.trigger import Trigger
from ..observe.payload import MAX_PAYLOAD_BYTES, decode_payload
from .conclude import CONCLUDE_RESERVE_S, conclude
from .gather import add_last_records, add_side_facts

__all__ = ["LOCAL_PAYLOAD", "take_part_locally"]

#: ``.rank_<r>.payload``: no dump reader takes it for a dump (its name does not end in a rank number).
LOCAL_PAYLOAD = ".rank_{}.payload"
_POLL_S = 0.05

log = logger("fr_otel.agent")


def take_part_locally(me: IncidentRank, trigger: Trigger, deadline: float,
                      part: tuple[bytes, bool]) -> dict[str, Any] | None:
    """This rank's part in the incident of its node, without the store (``part``: its
    :func:`~.part.own_part`); the node's verdict too when it coordinates here: the rank
    that raised the incident if it runs on this node (it may have started through the store and
    seen it go), else the first of the node to claim. Returns the node's verdict summary where it concluded here."""
    k = trigger.number
    went_local_ns = time.time_ns()  # the store does not answer this node (else it would not be here)
    trace_hex = trace_hex_for(me.job_id, str(k))
    folder = dump_path(me, trace_hex).parent
    payload, written = part
    with me.health.guard("leaving the recorder for this node's coordinator"):
        atomic_write(folder / LOCAL_PAYLOAD.format(me.rank), payload, mkdir=True)
    me.hosts.from_disk()
    raiser = trigger.raised_by
    lock = folder / f".local_{me.process.host or me.rank}.lock"
    if raiser != me.rank and raiser in _local_ranks(me):
        # The raiser runs here and read the heartbeats: it reports this node's part, once it has
        # claimed it; if it has not within a few polls (it may be the rank that is leaving), this one does.
        until = min(time.monotonic() + 3 * me.config.poll_interval, deadline - CONCLUDE_RESERVE_S)
        while not lock.exists() and time.monotonic() < until:
            time.sleep(_POLL_S)
    if not _claim(lock):
        return None
    evidence = _gather_local(me, folder, deadline)
    silent = [r for r in _local_ranks(me) if r not in evidence.dumps]
    if silent:
        add_last_records(me, evidence, silent, folder)
    add_side_facts(me, evidence, store_lost_since_ns=went_local_ns)
    return conclude(me, trigger, evidence, trace_hex, deadline, dump_written=written, local=True)


def _claim(path: Path) -> bool:
    """True for the one local rank that creates ``path`` first: it coordinates this node's part."""
    try:
        atomic_write(path, str(os.getpid()).encode(), replace=False)
    except OSError:
        return False
    return True


def _local_ranks(me: IncidentRank) -> list[int]:
    """This node's ranks, as the host map says (else this rank alone)."""
    host = me.process.host
    return sorted(r for r, p in me.hosts.processes.items() if host is not None and p.host == host) or [me.rank]


def _gather_local(me: IncidentRank, folder: Path, deadline: float) -> ReadResult:
    """This node's ranks' payloads from the folder (waiting, bounded, for each)."""
    ranks = _local_ranks(me)
    until = min(time.monotonic() + me.config.gather_seconds, deadline - CONCLUDE_RESERVE_S)
    paths = {r: folder / LOCAL_PAYLOAD.format(r) for r in ranks}
    while not all(p.exists() for p in paths.values()) and time.monotonic() < until:
        time.sleep(_POLL_S)
    problems: list[str] = []
    read = ReadResult(problems=problems)
    for rank, path in paths.items():
        try:
            payload = read_regular(path, MAX_PAYLOAD_BYTES, follow_links=False)  # planted there? refused
        except OSError:
            continue
        dump = decode_payload(payload, rank, f"rank {rank} (this node)", problems)
        if dump is not None:
            read.dumps[rank] = dump
    absent = [r for r in ranks if r not in read.dumps]
    if absent:
        problems.append(f"rank(s) {compress_ranks(absent)} of this node left no recorder within "
                        f"{me.config.gather_seconds:g} s")
    others = me.world_size - len(ranks)
    if others:
        problems.append(f"the job's store is unreachable from here: the other {others} rank(s) of the job "
                        "could not be asked for their recorders")
    return read
