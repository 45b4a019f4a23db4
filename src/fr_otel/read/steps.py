"""Training steps as data: one rank's step counter and its recent step starts.

The live agent counts steps (:mod:`fr_otel.agent.guest.step_counter`) and sends them as a
:class:`StepLog` in its payload; the coordinator writes them to ``steps.json`` beside the
dumps. Here they are read back from that untrusted data; :mod:`fr_otel.diagnosis.step_map`
answers which step a collective belongs to (the recorder stamps every collective with its
enqueue time on the same clock as the step starts).
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, overload

from ..common.json_types import is_exact_int
from .side_files import read_per_rank_file

__all__ = ["PAYLOAD_KEY", "RING", "STEPS_FILE", "StepLog", "StepStarts", "read_steps_file", "step_log_from_raw"]

#: Top-level key of an agent payload holding the rank's :class:`StepLog`.
PAYLOAD_KEY = "fr_otel_steps"
#: The step map beside the dumps (its name ends in no rank number, so the reader never takes it for a dump).
STEPS_FILE = "steps.json"
RING = 512  # recent step starts kept per rank (16 bytes each)
_MAX_STEP = 1 << 62


class StepStarts(Sequence[tuple[int, int]]):
    """(step, start ns) pairs held as two int64 columns: what a coordinator keeps of 100k ranks'
    steps (~300 bytes a rank where tuples of tuples take ~2 KB); reads, slices and compares as pairs."""

    __slots__ = ("steps", "times")

    def __init__(self, steps: array[int], times: array[int]) -> None:
        self.steps, self.times = steps, times

    def __len__(self) -> int:
        return len(self.times)

    @overload
    def __getitem__(self, i: int) -> tuple[int, int]: ...
    @overload
    def __getitem__(self, i: slice) -> StepStarts: ...
    def __getitem__(self, i: int | slice) -> tuple[int, int] | StepStarts:
        if isinstance(i, slice):
            return StepStarts(self.steps[i], self.times[i])
        return self.steps[i], self.times[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __hash__(self) -> int:
        return hash(tuple(self))


@dataclass(frozen=True, slots=True)
class StepLog:
    """One rank's training steps: the step it is in, and when each recent step began."""

    step: int
    starts: Sequence[tuple[int, int]]  # (step, start epoch ns), oldest first: a tuple, or StepStarts
    source: str = ""  # "optimizer" | "fr_otel.step"

    def step_at(self, ns: int) -> int | None:
        """The step running at ``ns`` (this rank's clock); None before the oldest start kept."""
        i = bisect.bisect_right(self.starts, ns, key=_start_time)
        return self.starts[i - 1][0] if i else None

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "source": self.source, "starts": [list(s) for s in self.starts]}


def _start_time(start: tuple[int, int]) -> int:
    return start[1]


def step_log_from_raw(value: Any) -> StepLog | None:
    """A :class:`StepLog` from untrusted data (a payload or ``steps.json``); None when unusable."""
    if not isinstance(value, dict):
        return None
    current = value.get("step")
    starts = value.get("starts")
    if not _is_int(current) or not isinstance(starts, (list, tuple)):
        return None
    clean: list[tuple[int, int]] = []
    for item in starts[-RING:]:
        if (isinstance(item, (list, tuple)) and len(item) == 2 and _is_int(item[0]) and _is_int(item[1])
                and item[1] >= 0 and (not clean or item[1] >= clean[-1][1])):
            clean.append((int(item[0]), int(item[1])))
    source = value.get("source")
    return StepLog(int(current), tuple(clean), source if isinstance(source, str) else "")


def _is_int(v: Any) -> TypeGuard[int]:
    return is_exact_int(v) and abs(v) < _MAX_STEP


def read_steps_file(path: str, problems: list[str]) -> dict[int, StepLog]:
    """Rank -> :class:`StepLog` from a ``steps.json``; one problem line when it is unusable."""
    return read_per_rank_file(path, problems, "training steps unknown", step_log_from_raw)
