"""Training steps: counted live, then mapped onto collectives ("all_reduce #26 belongs to step 13").

Live side (inside the training process, no torch import here): :data:`COUNTER` counts
steps. The agent registers :meth:`StepCounter.optimizer_stepped` as PyTorch's global
optimizer post-step hook, so no code change is needed; custom loops call
:func:`fr_otel.step` instead (an explicit step wins over the hook from then on). A step
costs an integer increment and one append to a bounded ring of ``(step, start time)``.
The hook deliberately does not read sequence numbers: that would be a recorder call per
step. The recorder stamps every collective with its enqueue time on the same clock, so
the ring places each collective in its step afterwards (and the step map file beside the
dumps lists, per group, the first sequence number of each recent step).

Read side (pure data): :class:`StepLog` is one rank's counter and ring as a dump,
payload or ``steps.json`` carries it; :mod:`fr_otel.diagnosis.step_map` answers which step a
collective belongs to.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from .side_files import read_per_rank_file

__all__ = [
    "COUNTER", "PAYLOAD_KEY", "STEPS_FILE", "StepCounter", "StepLog", "read_steps_file", "step", "step_log_from_raw",
]

#: Top-level key of an agent payload holding the rank's :class:`StepLog`.
PAYLOAD_KEY = "fr_otel_steps"
#: The step map beside the dumps (its name ends in no rank number, so the reader never takes it for a dump).
STEPS_FILE = "steps.json"
RING = 512  # recent step starts kept per rank (16 bytes each)
_MAX_STEP = 1 << 62


@dataclass(frozen=True, slots=True)
class StepLog:
    """One rank's training steps: the step it is in, and when each recent step began."""

    step: int
    starts: tuple[tuple[int, int], ...]  # (step, start epoch ns), oldest first
    source: str = ""  # "optimizer" | "fr_otel.step"

    def step_at(self, ns: int) -> int | None:
        """The step running at ``ns`` (this rank's clock); None before the oldest start kept."""
        i = bisect.bisect_right(self.starts, ns, key=_start_time)
        return self.starts[i - 1][0] if i else None

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "source": self.source, "starts": [list(s) for s in self.starts]}


def _start_time(start: tuple[int, int]) -> int:
    return start[1]


class StepCounter:
    """The live counter (one per process); every method is safe from any thread and never raises."""

    __slots__ = ("step", "source", "_starts", "_optimizer")

    def __init__(self) -> None:
        self.step = 0
        self.source = ""
        self._starts: deque[tuple[int, int]] = deque(maxlen=RING)
        self._optimizer: int | None = None  # id() of the optimizer whose steps count

    def optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """``register_optimizer_step_post_hook`` target: one step per ``step()`` of the first
        optimizer seen (a job with two optimizers does not count double)."""
        if self.source == "fr_otel.step":
            return
        if self._optimizer != id(optimizer):
            if self._optimizer is not None:
                return
            self._optimizer = id(optimizer)
            self.source = "optimizer"
        self.step += 1
        self._starts.append((self.step, time.time_ns()))

    def arm(self) -> None:
        """Counting starts now: step 0 began here (the agent calls this as it registers the hook)."""
        if not self._starts:
            self._starts.append((0, time.time_ns()))

    def set(self, n: int) -> None:
        """Step ``n`` begins now (:func:`fr_otel.step`)."""
        self.source = "fr_otel.step"
        self.step = int(n)
        self._starts.append((self.step, time.time_ns()))

    @property
    def started_ns(self) -> int | None:
        """When the current step began (epoch ns), once a step was counted."""
        if not self.source:
            return None
        try:
            return self._starts[-1][1]
        except IndexError:
            return None

    def log(self) -> StepLog | None:
        """What the counter knows, or None while no step was ever counted (a job without an
        optimizer, or still in its first step, has no step to report)."""
        if not self.source:
            return None
        return StepLog(self.step, tuple(self._starts), self.source)  # tuple(deque) copies in C, under the GIL


#: This process's counter (the agent's hook and :func:`step` feed it).
COUNTER = StepCounter()


def step(n: int) -> None:
    """Tell fr-otel that training step ``n`` begins now (for loops without a torch optimizer)."""
    COUNTER.set(n)


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


def _is_int(v: Any) -> bool:
    return type(v) is int and abs(v) < _MAX_STEP


def read_steps_file(path: str, problems: list[str]) -> dict[int, StepLog]:
    """Rank -> :class:`StepLog` from a ``steps.json``; one problem line when it is unusable."""
    return read_per_rank_file(path, problems, "training steps unknown", step_log_from_raw)
