"""One rank's Flight Recorder dump, normalised.

Pickle and JSON dumps, versions 2.x, NCCL and gloo all become the same small,
immutable records, so nothing downstream needs to know about format quirks
(JSON's 0-for-missing times, string ``pg_status`` values, lists for tuples,
``nccl_version`` vs ``comm_lib_version``). Plain data only: no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["Frame", "Entry", "Progress", "PgConfig", "RankDump"]


class Frame(NamedTuple):
    """One Python stack frame of the call that enqueued a collective."""

    name: str
    filename: str
    line: int


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
        """The op without its backend prefix (``nccl:all_reduce`` -> ``all_reduce``)."""
        return self.profiling_name.partition(":")[2] or self.profiling_name


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
class RankDump:
    """Everything one rank's dump says, with the rank taken from its file name."""

    rank: int
    path: str
    version: str
    backend: str  # "nccl", "gloo", or the profiling-name prefix seen; "unknown" if none
    comm_lib_version: str
    pg_config: dict[str, PgConfig]
    pg_status: dict[int, Progress]  # keyed by this rank's *local* pg_id
    entries: list[Entry] = field(default_factory=list)
    has_frames: bool = False
    file_mtime_ns: int | None = None
