"""What a rank sends its incident's coordinator: its recorder, trimmed, with true membership.

The local dump file keeps torch's bytes untouched. What goes through the store is smaller
and sounder: per group the last ``keep`` collectives plus everything still in flight
(what the verdict and the focused trace use), and ``pg_config`` replaced by the groups the
rank's Python side knows (gloo's own ``pg_config`` is empty in torch 2.13), so the
coordinator's job model gets real membership instead of inferring it. Framed as
``b"FRO1" + dump time (u64 ns) + zlib(pickle)``; the coordinator reads the pickle with
the restricted unpickler like any other dump.
"""

from __future__ import annotations

import pickle
import struct
import zlib
from collections.abc import Iterable
from functools import partial
from typing import Any

from ...read.dump import Entry, RankDump
from ...read.dump_file import parse_dump_bytes
from ...read.safe_pickle import DEFAULT_MAX_FILE_BYTES
from ...read.entry_rules import completion_rule
from ...read.failed import PAYLOAD_KEY as FAILED_KEY
from ...read.failed import FailedCollective
from ...read.live_stack import PAYLOAD_KEY as STACKS_KEY
from ...read.live_stack import LiveStacks
from ...read.pg_meta import member_runs
from ...read.rank_facts import EXIT_KEY, HOST_VIEW_KEY, ExitRecord, ProcessFacts
from ...read.rank_process import PAYLOAD_KEY as PROCESS_KEY
from ...read.rank_process import RankProcess
from ...read.recent import recent_and_in_flight
from ...read.steps import PAYLOAD_KEY as STEPS_KEY
from ...read.steps import StepLog
from ...common.gc_pause import gc_paused
from ...common.inflate import InflatedTooLarge, inflate
from .recorder import GroupInfo

__all__ = ["MAX_PAYLOAD_BYTES", "decode_payload", "encode_payload", "entries_per_group", "frame_payload", "payload_body",
           "pg_config_for", "trim_entries"]

#: A payload file read from a node's folder is at most this big (a whole recorder, compressed, is far less).
MAX_PAYLOAD_BYTES = 256 << 20
_MAGIC = b"FRO1"
_HEADER = struct.Struct(">4sQ")


def pg_config_for(groups: Iterable[GroupInfo]) -> dict[str, dict[str, str]]:
    """``pg_config`` in torch's own shape, members as runs (``"[0-16383]"``, ``"[5-16381:8]"``: the world
    and data-parallel groups would otherwise put every member's number in every member's payload)."""
    return {g.name: {"name": g.name, "desc": g.desc, "ranks": f"[{member_runs(sorted(set(g.ranks)))}]"}
            for g in groups if g.name}


#: A coordinator decodes world size x groups x entries-per-group entries: this bounds the product
#: (64 per group up to 4096 ranks, 16 at 16k) so the trace stays within a minute at 16k ranks.
COORDINATOR_ENTRY_BUDGET = 64 * 4096
MIN_ENTRIES_PER_GROUP = 16


def entries_per_group(configured: int, world_size: int | None) -> int:
    """How many completed entries per group a rank sends: the configured number, less at scale
    (never fewer than 16, what a focused trace shows; in-flight entries always go)."""
    if not world_size or world_size <= 0:
        return configured
    return min(configured, max(MIN_ENTRIES_PER_GROUP, COORDINATOR_ENTRY_BUDGET // world_size))


def trim_entries(entries: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """Per group, the last ``keep`` entries plus every one not completed; order kept."""
    return recent_and_in_flight(entries, keep, _group_of, completion_rule(entries))


def _group_of(entry: dict[str, Any]) -> Any:
    try:
        return entry["process_group"][0]
    except (KeyError, TypeError, IndexError):
        return None


def encode_payload(raw_dump: bytes, groups: Iterable[GroupInfo], keep: int, dumped_at_ns: int,
                   process: RankProcess, steps: StepLog | None = None, now: LiveStacks | None = None,
                   failed: tuple[FailedCollective, ...] = (), host_view: dict[int, ProcessFacts] | None = None,
                   leaving: ExitRecord | None = None) -> bytes:
    """Trim and re-label one of this process's own dumps for the store; say where it runs,
    its training step, (at incident time) where its threads are now and what /proc shows of its host's
    ranks, which collectives the backend retired as failed, and how it is leaving."""
    with gc_paused():
        data = pickle.loads(raw_dump)  # torch's bytes from this very process
        data["entries"] = trim_entries(list(data.get("entries") or []), keep)
        data["pg_config"] = pg_config_for(groups)
        data[PROCESS_KEY] = process.as_json()
        if steps is not None:
            data[STEPS_KEY] = steps.as_json()
        if now is not None:
            data[STACKS_KEY] = now.as_json()
        if failed:
            data[FAILED_KEY] = [m.as_json() for m in failed]
        if host_view:
            data[HOST_VIEW_KEY] = {str(r): f.as_json() for r, f in host_view.items()}
        if leaving is not None:
            data[EXIT_KEY] = leaving.as_json()
        body = pickle.dumps(data, protocol=4)
    return frame_payload(body, dumped_at_ns)


def frame_payload(body: bytes, dumped_at_ns: int, level: int = 1) -> bytes:
    """A dump's pickle framed as a payload: ``b"FRO1"``, the dump time, the pickle compressed (``level`` 0: stored,
    for a body of a few hundred bytes written many times a second)."""
    return _HEADER.pack(_MAGIC, dumped_at_ns) + zlib.compress(body, level)


def payload_body(payload: bytes, limit: int) -> tuple[int, bytes]:
    """A payload's dump time and its pickle, inflated to at most ``limit`` bytes; ValueError (its one line) when
    it is none or is larger."""
    if len(payload) < _HEADER.size:
        raise ValueError("too short for a payload")
    magic, dumped_at_ns = _HEADER.unpack_from(payload)
    if magic != _MAGIC:
        raise ValueError("not an fr-otel payload")
    try:
        return dumped_at_ns, inflate(payload[_HEADER.size:], limit)
    except InflatedTooLarge:
        raise ValueError(f"over {limit} bytes inflated") from None
    except zlib.error as exc:
        raise ValueError(f"corrupt: {exc}") from None


def decode_payload(payload: bytes, rank: int, source: str, problems: list[str]) -> RankDump | None:
    """A payload from the store as a :class:`RankDump` (restricted unpickler); None if unusable."""
    if len(payload) < _HEADER.size:
        problems.append(f"{source}: payload too short")
        return None
    magic, dumped_at_ns = _HEADER.unpack_from(payload)
    if magic != _MAGIC:
        problems.append(f"{source}: not an fr-otel payload")
        return None
    try:
        body = inflate(payload[_HEADER.size:], DEFAULT_MAX_FILE_BYTES)
    except InflatedTooLarge:
        problems.append(f"{source}: over {DEFAULT_MAX_FILE_BYTES} bytes inflated; skipped")
        return None
    except zlib.error as exc:
        problems.append(f"{source}: corrupt payload: {exc}")
        return None
    with gc_paused():
        # Columns and tails only: a coordinator holds thousands of these. Entries on demand,
        # from the compressed payload (the coordinator holds it anyway), not the 5x larger body.
        dump = parse_dump_bytes(body, rank, source, dumped_at_ns=dumped_at_ns, problems=problems, full=False)
    if dump is not None:
        dump.load_entries_with(partial(_payload_entries, payload, rank, source))
    return dump


def _payload_entries(payload: bytes, rank: int, source: str) -> list[Entry] | None:
    magic, dumped_at_ns = _HEADER.unpack_from(payload)
    dump = parse_dump_bytes(inflate(payload[_HEADER.size:], DEFAULT_MAX_FILE_BYTES), rank, source, dumped_at_ns=dumped_at_ns,
                            problems=[])
    return dump.entries if dump is not None else None
