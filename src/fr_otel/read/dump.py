"""One rank's Flight Recorder dump, normalised.

Pickle and JSON dumps, versions 2.x, NCCL and gloo all become the same small,
immutable records, so nothing downstream needs to know about format quirks
(JSON's 0-for-missing times, string ``pg_status`` values, lists for tuples,
``nccl_version`` vs ``comm_lib_version``). Plain data only: no torch import.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from .rank_facts import ExitRecord, ProcessFacts
from .failed import FailedCollective
from .frame import Frame
from .last_record import LastRecord
from .rank_process import RankProcess
from .steps import StepLog

if TYPE_CHECKING:
    from .live_stack import LiveStacks

__all__ = ["Entry", "OpInterval", "Progress", "PgConfig", "P2PChannel", "GroupHistory", "RankDump",
           "op_interval", "op_name", "MAX_ESTIMATED_END_NS"]


def op_name(profiling_name: str) -> str:
    """The op without its backend prefix (``nccl:all_reduce`` -> ``all_reduce``); a name
    without one stands for itself."""
    return profiling_name.partition(":")[2] or profiling_name


class Entry(NamedTuple):
    """One recorder entry (a collective or p2p op as this rank enqueued it).

    ``completed`` is already backend-aware: NCCL reports ``state == "completed"``;
    gloo never leaves ``scheduled`` and signals progress only through ``retired``.
    Times are epoch nanoseconds, ``None`` when the recorder did not know them.
    """

    record_id: int
    pg_id: int
    pg_name: str
    pg_desc: str
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    profiling_name: str
    is_p2p: bool
    state: str
    retired: bool
    completed: bool
    time_created_ns: int
    time_started_ns: int | None
    time_completed_ns: int | None
    duration_ms: float | None
    timeout_ms: int | None
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    thread_name: str
    thread_id: str
    frames: tuple[Frame, ...]  # innermost first; () when the dump has none (JSON)

    @property
    def op(self) -> str:
        """The op without its backend prefix (see :func:`op_name`)."""
        return op_name(self.profiling_name)

    def interval(self, reference_ns: int, *, next_created_ns: int | None = None,
                 group_next_ns: int | Callable[[], int | None] | None = None) -> OpInterval:
        """When this op ran (see :func:`op_interval`)."""
        return op_interval(self.time_created_ns, self.completed, reference_ns, completed_ns=self.time_completed_ns,
                           duration_ms=self.duration_ms, next_created_ns=next_created_ns,
                           group_next_ns=None if self.is_p2p else group_next_ns)


#: A guessed end (gloo records no completion time) lies at most this long after the op's
#: enqueue: a completed op must not look stretched across the compute or stall that followed it.
MAX_ESTIMATED_END_NS = 1_000_000_000


class OpInterval(NamedTuple):
    """When an op ran, as far as its rank's dump tells."""

    start: int  # its enqueue
    end: int
    estimated: bool  # completed, but no usable completion time: the end is inferred
    in_flight: bool  # never completed: it runs to the reference time


def op_interval(
    created_ns: int,
    completed: bool,
    reference_ns: int,
    *,
    completed_ns: int | None = None,
    duration_ms: float | None = None,
    next_created_ns: int | None = None,
    group_next_ns: int | Callable[[], int | None] | None = None,
) -> OpInterval:
    """The one rule for when an op ends: a trace span and a report bar of the op end alike.

    In flight (never completed): open, up to the reference time. Completed: at its
    completion time when recorded (and not before its enqueue); else, estimated, after its
    recorded duration; else (gloo records neither) guessed as the earliest of what bounds it:
    the rank's next enqueue (``next_created_ns``), the group's next collective enqueued by
    any rank (``group_next_ns``, or a function that finds it, called only for a guess), the
    reference time, and :data:`MAX_ESTIMATED_END_NS` after its enqueue.
    """
    if not completed:
        return OpInterval(created_ns, max(reference_ns, created_ns), False, True)
    if completed_ns and completed_ns >= created_ns:
        return OpInterval(created_ns, completed_ns, False, False)
    if duration_ms is not None:
        return OpInterval(created_ns, created_ns + int(duration_ms * 1e6), True, False)
    end = min(created_ns + MAX_ESTIMATED_END_NS, reference_ns)
    if next_created_ns is not None:
        end = min(end, next_created_ns)
    group_next = group_next_ns() if callable(group_next_ns) else group_next_ns
    if group_next is not None:
        end = min(end, group_next)
    return OpInterval(created_ns, max(end, created_ns), True, False)


class Progress(NamedTuple):
    """A group's counters on one rank (``pg_status``): last sequence numbers seen."""

    enqueued: int
    started: int
    completed: int


class PgConfig(NamedTuple):
    """A group as the dump's ``pg_config`` describes it; ``ranks`` is None when unusable."""

    name: str
    desc: str
    ranks: tuple[int, ...] | None


@dataclass(slots=True)
class P2PChannel:
    """One rank's send/recv of one kind to one peer in one group (``send 1->2``), in record order.

    Kept apart from the collectives: p2p counters are per rank and never comparable
    across ranks; pairing goes by order within the channel (see :mod:`fr_otel.diagnosis.p2p`).
    """

    done: bytes  # 1 where completed (backend-aware)
    created_ns: array[int]  # 'q'
    fingerprint: array[int]  # 'q': op, sizes, dtypes hashed (see RankDump.fingerprints)


@dataclass(slots=True)
class GroupHistory:
    """One rank's collectives (not p2p) of one group, as columns in record order.

    This compact view is all the cross-rank analysis reads: a few bytes per entry,
    cheap to build (C-level column extraction) and cheap to ship between processes,
    where 2000 full :class:`Entry` objects per rank are not.
    """

    name: str
    desc: str
    local_id: int
    seq: array[int] | range  # 'q': collective_seq_id; a range when contiguous
    completed: bytes  # 1 where completed (backend-aware)
    created_ns: array[int]  # 'q': time_created_ns
    fingerprint: array[int]  # 'q': what must agree across ranks (op, sizes, dtypes), hashed; see fingerprints
    p2p_count: int = 0  # send/recv entries of this group (not in the columns)
    p2p: dict[str, P2PChannel] = field(default_factory=dict)  # "send 1->2" -> that channel's ops

    @property
    def contiguous(self) -> bool:
        """seq runs first, first+1, ..., last (no gap, one op per seq: the usual case), so an op's
        position is seq - first. The reader stores such a run as a ``range``: found once, in the
        reader's workers, and 16 KB less per 2000 entries than an array."""
        seq = self.seq
        return type(seq) is range and seq.step == 1

    def position(self, seq: int) -> int | None:
        """Where #``seq`` sits in the columns (the first of several ops sharing it), or None when
        the ring does not hold it: by offset when contiguous, else by binary search."""
        s = self.seq
        if isinstance(s, range) and self.contiguous:
            i = seq - s.start
            return i if 0 <= i < len(s) else None
        i = bisect_left(s, seq)
        return i if i < len(s) and s[i] == seq else None


@dataclass(slots=True)
class RankDump:
    """Everything one rank's dump says, with the rank taken from its file name.

    ``histories`` (per group, columns) and ``tail`` (the newest and the in-flight
    entries as :class:`Entry`) are always there. The full ``entries`` list is
    built on first use: from the file again for large jobs read in parallel.
    """

    rank: int
    path: str
    version: str
    backend: str  # "nccl", "gloo", or the profiling-name prefix seen; "unknown" if none
    comm_lib_version: str
    pg_config: dict[str, PgConfig]
    pg_status: dict[int, Progress]  # keyed by this rank's *local* pg_id
    histories: dict[str, GroupHistory] = field(default_factory=dict)
    tail: list[Entry] = field(default_factory=list)
    entry_count: int = 0
    fingerprints: dict[int, tuple[Any, ...]] = field(default_factory=dict)  # id -> (op, sizes..., dtypes...)
    next_created_ns: dict[int, int] = field(default_factory=dict)  # record_id -> next enqueue (the tail's; see next_enqueue_ns)
    latest_ns: int = 0  # newest enqueue or completion time in the dump
    from_start: bool = False  # the ring never wrapped and nothing was left out (record ids start at 0)
    has_frames: bool = False
    file_mtime_ns: int | None = None
    process: RankProcess | None = None  # where it ran, when the dump says (the live agent's payloads do)
    steps: StepLog | None = None  # training steps, when the live agent counted them
    now: LiveStacks | None = None  # its threads' stacks at incident time (the live agent's payloads)
    failed: tuple[FailedCollective, ...] = ()  # collectives the backend retired as failed (the live agent says)
    host_view: dict[int, ProcessFacts] = field(default_factory=dict)  # its host's ranks as its agent read /proc
    exit: ExitRecord | None = None  # how it left, when it said (its exit copy)
    #: Not its dump: its node-local copy, loaded because the rank sent nothing (:mod:`.last_record`).
    record: LastRecord | None = None
    #: Only what the analysis reads (a node summary's, see :mod:`.node_summary`): columns, counters and a
    #: few whole entries; the rest of its entries and its stacks stayed on its node.
    compact: bool = False
    _entries: list[Entry] | None = None
    _loader: Callable[[], list[Entry] | None] | None = None
    _all_next_known: bool = False

    @property
    def entries(self) -> list[Entry]:
        """Every entry, oldest first (loaded on first use when the reader kept only columns)."""
        if self._entries is None:
            loaded = None
            if self._loader is not None:
                try:
                    loaded = self._loader()
                except Exception:  # noqa: BLE001 - the file changed or vanished since: keep the tail
                    loaded = None
            self._entries = loaded if loaded is not None else list(self.tail)
        return self._entries

    def next_enqueue_ns(self, record_id: int) -> int | None:
        """When this rank enqueued the op after entry ``record_id``: an upper bound on that entry's
        completion, since a rank's ops run in order. The reader keeps it for the tail; any other
        entry's comes from the full entry list, built once. None for the newest entry."""
        known = self.next_created_ns.get(record_id)
        if known is not None or self._all_next_known or (self.tail and record_id >= self.tail[-1].record_id):
            return known  # the newest entry has no next: no need to load the rest
        entries = self.entries
        self.next_created_ns.update((a.record_id, b.time_created_ns) for a, b in zip(entries, entries[1:]))
        self._all_next_known = True
        return self.next_created_ns.get(record_id)

    def set_entries(self, entries: list[Entry] | None) -> None:
        """Hold the full entry list, parsed along with the columns (None: build it on first use)."""
        self._entries = entries

    def load_entries_with(self, loader: Callable[[], list[Entry] | None]) -> None:
        """Build ``entries`` with ``loader`` on first use (None from it, or an error: the tail)."""
        self._entries = None
        self._loader = loader

    def rewrite_entries(self, rewrite: Callable[[list[Entry]], list[Entry]]) -> None:
        """Apply ``rewrite`` to the tail and to the entries, loaded now or later (a group renamed)."""
        self.tail = rewrite(self.tail)
        if self._entries is not None:
            self._entries = rewrite(self._entries)
        if self._loader is not None:
            loader = self._loader
            self._loader = lambda: None if (loaded := loader()) is None else rewrite(loaded)

    def mark_failed(self, mark: FailedCollective) -> None:
        """The backend retired ``mark``'s collective because it failed: from now on it counts as
        never completed, in the columns, the counters, the tail and the entries (see :mod:`.failed`)."""
        if any(m[:2] == mark[:2] for m in self.failed):
            return
        self.failed = (*self.failed, mark)
        h = self.histories.get(mark.group)
        if h is not None:
            done = bytearray(h.completed)
            for i, s in enumerate(h.seq):
                if s == mark.seq:
                    done[i] = 0
            h.completed = bytes(done)
            status = self.pg_status.get(h.local_id)
            if status is not None and status.completed >= mark.seq:
                self.pg_status[h.local_id] = status._replace(completed=mark.seq - 1)

        def rewrite(entries: list[Entry]) -> list[Entry]:
            return [e._replace(completed=False) if (e.pg_name == mark.group and e.collective_seq_id == mark.seq
                                                    and not e.is_p2p) else e for e in entries]

        self.rewrite_entries(rewrite)

    def __getstate__(self) -> dict[Any, Any]:
        # Ship columns and tail between processes, never a loader closure or the full list.
        return {f: getattr(self, f) for f in self.__dataclass_fields__ if f not in ("_entries", "_loader", "_all_next_known")}

    def __setstate__(self, state: dict[Any, Any]) -> None:
        for f in self.__dataclass_fields__:
            setattr(self, f, state.get(f))
        self._all_next_known = False
