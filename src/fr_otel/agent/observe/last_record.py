"""This rank's last record: a node-local copy of its recorder's state, for the moment it cannot answer.

The rank everyone waits for is often the one whose agent cannot send its part: its GIL held in native code,
SIGSTOPped, killed. So each rank's agent keeps, in its node's folder (:mod:`..links.node_channel`: node-local
memory, a folder only this user may enter), a copy of what its poll already reads (the ~0 ms counters read):
per recorder slot the last enqueued, started and completed collective, its groups and their members, its
training step, where it runs, and when. Bounded (a few hundred bytes per group), written atomically and only
when that state changes, once per poll; when it does not, the file's time is set instead (one system call), so a
reader can tell a copy its agent still vouches for from a stale one. Not on the wait sampler's reads too (ten a
second): a write costs ~0.1-0.7 ms of CPU on a loaded box, and a fresher copy changes no verdict (a silent rank's
record holds until the incident, whenever taken). A full read of the recorder's entries would add their call
sites but costs 12 ms at 2,000 entries without stacks and 240 ms with them (torch 2.13, gloo, this project's
2-core box), holding the GIL: too dear for every poll.

An incident loads the copy for a rank that sends no part (:func:`load_record`): untrusted input read like a
dump (bounded, the restricted unpickler, every field validated), refused with one line when it is forged,
another process's, dated ahead, or older than the rank's own last heartbeat (its agent went on polling without
vouching for it: stale). What is kept is a dump in torch's shape with :data:`fr_otel.read.last_record.RECORD_KEY`
(when taken, vouched for, and the rank went silent), so the incident's folder keeps it and ``fr-otel analyze``
of the folder reads the same.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...read.dump import RankDump
from ...read.dump_file import parse_dump_bytes
from ...read.last_record import RECORD_KEY, record_from_raw
from ...read.rank_process import PAYLOAD_KEY as PROCESS_KEY
from ...read.rank_process import RankProcess
from ...read.safe_pickle import load_restricted
from ...read.steps import PAYLOAD_KEY as STEPS_KEY
from ...read.steps import StepLog
from .payload import frame_payload, payload_body, pg_config_for
from .recorder import Counters, GroupInfo

if TYPE_CHECKING:
    from ..links.node_channel import NodeChannel

__all__ = ["MAX_RECORD_BYTES", "RecordKeeper", "encode_record", "load_record", "record_groups"]

#: A last record's file is at most this big (a rank in 64 groups writes ~4 KB), and inflates to at most
#: :data:`_MAX_INFLATED`.
MAX_RECORD_BYTES = 256 << 10
_MAX_INFLATED = 4 << 20
#: Groups kept in a record (past it, the highest-numbered slots are left out: a job that made thousands).
MAX_RECORD_GROUPS = 1024
#: Step starts kept in a record (its step and the last few starts: a payload carries the rest).
RECORD_STEPS = 8
#: A record whose agent last vouched for it this many polls before the rank's last heartbeat is stale.
STALE_RECORD_POLLS = 3


def encode_record(version: str, counters: Mapping[int, Counters], groups: tuple[GroupInfo, ...],
                  process: RankProcess, steps: StepLog | None, taken_ns: int, pid: int,
                  pg_config: dict[str, dict[str, str]] | None = None) -> bytes:
    """The copy, framed as a payload (:func:`.payload.frame_payload`, stored: it is small): a dump in torch's shape
    with no entries. ``pg_config``: :func:`.payload.pg_config_for` of ``groups``, when the caller keeps it."""
    slots = sorted(counters)[:MAX_RECORD_GROUPS]
    data: dict[str, Any] = {
        "version": version or "2.0",
        "pg_config": pg_config if pg_config is not None else record_groups(groups, counters),
        "pg_status": {str(s): {"last_enqueued_collective": counters[s].enqueued,
                               "last_started_collective": counters[s].started,
                               "last_completed_collective": counters[s].completed} for s in slots},
        "entries": [],
        PROCESS_KEY: process.as_json(),
        RECORD_KEY: {"taken_ns": taken_ns, "pid": pid},
    }
    if steps is not None:  # its step, and when its last few began
        data[STEPS_KEY] = replace(steps, starts=tuple(steps.starts[-RECORD_STEPS:])).as_json()
    return frame_payload(pickle.dumps(data, protocol=4), taken_ns, level=0)


def record_groups(groups: tuple[GroupInfo, ...], counters: Mapping[int, Counters]) -> dict[str, dict[str, str]]:
    """The groups a record names: those with a recorder slot, at most :data:`MAX_RECORD_GROUPS`."""
    return pg_config_for([g for g in groups if g.local_id is None or g.local_id in counters][:MAX_RECORD_GROUPS])


class RecordKeeper:
    """Keeps this rank's last record in its node's folder: written on change, else vouched for (its time set)."""

    def __init__(self, node: NodeChannel, process: RankProcess, pid: int) -> None:
        self.node, self.process, self.pid = node, process, pid
        self._state: Any = None  # what the file holds now (None: nothing known to be there)
        self._dropped = False  # the rank left: a poll already under way writes nothing after that
        self._groups: tuple[Any, dict[str, dict[str, str]]] | None = None  # (groups, slots) -> their pg_config
        self.writes = 0
        self.vouches = 0
        self.bytes_written = 0
        self.cost_s = 0.0  # CPU time spent keeping it (the GIL's share: bench/bench_agent.py reports it)

    def keep(self, version: str, counters: Mapping[int, Counters], groups: tuple[GroupInfo, ...],
             steps: StepLog | None, now_ns: int) -> None:
        """One poll's state: written when it changed, else the file's time set. Raises OSError (the caller's
        guard says it once); the copy then goes, so that no stale copy outlives a failed write."""
        if self._dropped:
            return
        t0 = time.thread_time()
        state = (tuple(sorted(counters.items())), groups, steps.step if steps is not None else None)
        try:
            if state == self._state:
                self.node.vouch_record()
                self.vouches += 1
                return
            self._state = None
            if self._groups is None or self._groups[0] != (groups, frozenset(counters)):
                self._groups = ((groups, frozenset(counters)), record_groups(groups, counters))
            data = encode_record(version, counters, groups, self.process, steps, now_ns, self.pid, self._groups[1])
            self.node.keep_record(data)
            self._state = state
            self.writes += 1
            self.bytes_written += len(data)
        except OSError:
            self._state = None
            self.node.drop_record()
            raise
        finally:
            self.cost_s += time.thread_time() - t0

    def drop(self) -> None:
        """This rank leaves on its own: its record goes (it speaks for itself in its exit copy)."""
        self._dropped = True
        self._state = None
        self.node.drop_record()


def load_record(data: bytes, file_ns: int, rank: int, *, pid: int | None, heard_ns: int | None, now_ns: int,
                poll_interval: float, source: str) -> tuple[RankDump, bytes] | str:
    """Rank ``rank``'s copy (``file_ns``: its file's time) as a dump, and that dump's bytes for the incident's
    folder (its record now saying when the rank went silent: ``heard_ns``, its last heartbeat); or the one
    reason it is not used. ``pid``: the rank's process, where known."""
    try:
        dumped_at_ns, body = payload_body(data, _MAX_INFLATED)
        raw, _ = load_restricted(body)
    except (ValueError, pickle.UnpicklingError, MemoryError, RecursionError, EOFError) as exc:
        return f"unreadable ({str(exc)[:200] or type(exc).__name__})"
    record = record_from_raw(raw.get(RECORD_KEY)) if isinstance(raw, dict) else None
    if record is None or record.taken_ns != dumped_at_ns:
        return "not a last record fr-otel wrote (no believable stamp)"
    ahead = poll_interval * 1e9
    if record.taken_ns > now_ns + ahead or file_ns > now_ns + ahead:
        return "dated ahead of this host's clock"
    if pid is not None and record.pid is not None and record.pid != pid:
        return f"written by process {record.pid}, not the rank's process {pid} (an earlier run's)"
    record = replace(record, confirmed_ns=file_ns if file_ns >= record.taken_ns else None, silent_since_ns=heard_ns,
                     loaded_ns=now_ns)
    if heard_ns is not None and heard_ns - record.as_of_ns > STALE_RECORD_POLLS * poll_interval * 1e9:
        return (f"stale: its agent last vouched for it {(heard_ns - record.as_of_ns) / 1e9:.1f} s before the rank's "
                "last heartbeat")
    raw[RECORD_KEY] = record.as_json()
    kept = pickle.dumps(raw, protocol=4)
    problems: list[str] = []
    dump = parse_dump_bytes(kept, rank, source, dumped_at_ns=record.as_of_ns, problems=problems)
    if dump is None or dump.record is None or problems:  # fr-otel's writer makes no record with a fault
        return f"not a recorder's state: {problems[0]}" if problems else "not a recorder's state"
    return dump, kept

