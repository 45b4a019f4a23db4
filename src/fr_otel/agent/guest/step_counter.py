"""Count training steps live, inside the training process, with no code change.

The agent registers :meth:`StepCounter.optimizer_stepped` as PyTorch's global optimizer
post-step hook; custom loops call :func:`fr_otel.step` instead (an explicit step wins over
the hook from then on). A step costs an integer increment and one append to a bounded ring
of ``(step, start time)``. The hook deliberately reads no sequence numbers (that would be a
recorder call per step): the recorder stamps every collective with its enqueue time on the
same clock, so the ring places each collective in its step afterwards. What the counter
knows travels as a :class:`fr_otel.read.steps.StepLog`. No torch import.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any

from ...read.steps import RING, StepLog

__all__ = ["COUNTER", "StepCounter", "optimizer_step_hook", "step"]


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
    def current(self) -> int | None:
        """The step this process is in, once a step was counted (None before: no step to say)."""
        return self.step if self.source else None

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


def optimizer_step_hook() -> Any:
    """Count training steps with no code change: PyTorch's global optimizer post-step hook, on
    :data:`COUNTER`, registered once the application has imported ``torch.optim`` (never imported
    here). Its handle; None before ``torch.optim`` is imported (ask again later); False in a torch
    without the hook (``fr_otel.step(n)`` still counts)."""
    mod = sys.modules.get("torch.optim.optimizer")
    if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False):
        return None
    register = getattr(mod, "register_optimizer_step_post_hook", None)
    if register is None:
        return False
    COUNTER.arm()
    return register(COUNTER.optimizer_stepped)
