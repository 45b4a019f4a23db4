"""How long this rank waits in each group's collectives, sampled from the progress counters.

The rank that slows a job is the one nobody waits for: it arrives last at every collective and
waits least there, while its peers wait for it. So the live signal is each rank's own wait.
gloo records no completion time, and a full recorder read holds the GIL (~30 ms per 2000
entries), so the wait is not read from entries: the agent reads the progress counters (one
~10 us call) ten times a second by default (``FR_OTEL_WAIT_SAMPLE_INTERVAL``), at random gaps
(uniform in 0.5-1.5 times the interval, so a periodic training step cannot alias with it), and
gives each gap to the state the sample that opened it saw: waiting in a collective, or not. Summed, that is the time spent waiting
(the estimate is unbiased; its noise over a 30 s window is a few percent of the time); per
collective completed meanwhile, the wait per collective.

What "waiting" means depends on what the recorder records:

- a ``started`` counter (NCCL with ``TORCH_NCCL_ENABLE_TIMING=1``): start -> completion, the
  kernel waiting for its peers;
- gloo (CPU): the caller blocks from enqueue to completion, so enqueue -> completion;
- anything else (NCCL without timing): enqueue -> completion would count the GPU work queued
  ahead of the collective, longest on the *slow* rank: not measured, no series.

Pure bookkeeping (no torch, no threads): the agent's poll thread feeds it.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .recorder import Counters
from .state import GroupStatus, GroupWait

__all__ = ["WINDOW_S", "SlotWait", "WaitSampler", "enqueue_is_start", "group_waits"]

log = logging.getLogger("fr_otel.agent")

#: The recent window the agent compares ranks over (and publishes; see :mod:`..slow_watch`).
WINDOW_S = 30.0
#: A gap longer than this many mean intervals (the thread was held up) counts as this long.
_MAX_GAP = 10
_CHECKPOINT_S = 1.0


def enqueue_is_start(backend: str) -> bool:
    """A backend whose collectives block their caller from enqueue to completion (gloo on CPU),
    so that time is the wait; NCCL's enqueue only queues work on the GPU."""
    name = backend.lower()
    return "gloo" in name and "nccl" not in name


@dataclass(frozen=True, slots=True)
class SlotWait:
    """One recorder slot, since the agent started: seconds waited, seconds sampled, collectives completed."""

    wait_s: float = 0.0
    observed_s: float = 0.0
    completed: int = 0

    def minus(self, earlier: SlotWait) -> SlotWait:
        return SlotWait(self.wait_s - earlier.wait_s, self.observed_s - earlier.observed_s,
                        self.completed - earlier.completed)

    @property
    def share(self) -> float:
        """The share of the sampled time spent waiting (0 when nothing was sampled)."""
        return self.wait_s / self.observed_s if self.observed_s > 0 else 0.0

    @property
    def per_collective_s(self) -> float | None:
        """Seconds waited per collective completed (None when none completed)."""
        return self.wait_s / self.completed if self.completed > 0 else None


@dataclass(slots=True)
class _Last:
    at_ns: int
    waiting: bool
    completed: int


class WaitSampler:
    """Folds successive counter readings into per-slot wait totals and a recent window.

    ``interval_s`` is the mean gap between samples (the agent's ``wait_sample_interval``).
    """

    def __init__(self, interval_s: float, *, enqueue_is_start: bool, window_s: float = WINDOW_S,
                 rng: random.Random | None = None) -> None:
        self.interval_s = interval_s
        self.window_s = window_s
        self._enqueue_is_start = enqueue_is_start
        self._rng = rng if rng is not None else random.Random()
        self._last: dict[int, _Last] = {}
        self._totals: dict[int, SlotWait] = {}
        self._checkpoints: deque[tuple[int, dict[int, SlotWait]]] = deque()
        #: Samples taken, and the CPU seconds spent in them (the counters' read included: the agent adds it).
        self.samples = 0
        self.cost_s = 0.0
        #: True once collectives completed where no wait can be measured (NCCL without timing):
        #: the sampler will never see one, the agent may stop sampling.
        self.blind = False

    def gap_s(self) -> float:
        """How long until the next sample: random, so a periodic step cannot alias with the samples."""
        return self.interval_s * (0.5 + self._rng.random())

    def waiting(self, c: Counters, completed: int) -> bool | None:
        """Whether these counters show this rank waiting in a collective; None: not measurable."""
        if c.started >= 0:
            return c.started > completed
        if self._enqueue_is_start:
            return c.enqueued > completed
        return None

    def sample(self, counters: Mapping[int, Counters], now_ns: int,
               corrected: Callable[[int, int, int], int] | None = None) -> None:
        """Fold in one reading taken at ``now_ns`` (a monotonic clock). ``corrected(slot, enqueued,
        completed)`` fixes a completed counter the last full read knows better (see the poller)."""
        self.samples += 1
        longest = int(_MAX_GAP * self.interval_s * 1e9)
        for slot, c in counters.items():
            done = corrected(slot, c.enqueued, c.completed) if corrected is not None else c.completed
            waiting = self.waiting(c, done)
            if waiting is None:
                if not self.blind and done >= 1 and not self._totals:
                    self.blind = True
                    log.info("this recorder records no collective start times (NCCL: set TORCH_NCCL_ENABLE_TIMING=1): "
                             "no fr_collective_wait_seconds_total, so no slow-rank signal")
                continue
            last = self._last.get(slot)
            if last is not None and now_ns > last.at_ns:
                gap_s = min(now_ns - last.at_ns, longest) / 1e9
                t = self._totals.get(slot, SlotWait())
                self._totals[slot] = SlotWait(t.wait_s + (gap_s if last.waiting else 0.0), t.observed_s + gap_s,
                                              t.completed + max(done - last.completed, 0))
            self._last[slot] = _Last(now_ns, waiting, done)
        self._checkpoint(now_ns)

    def _checkpoint(self, now_ns: int) -> None:
        """Keep the totals about once a second, back to one checkpoint at or before the window's start."""
        if self._checkpoints and now_ns - self._checkpoints[-1][0] < _CHECKPOINT_S * 1e9:
            return
        self._checkpoints.append((now_ns, dict(self._totals)))
        start = now_ns - int(self.window_s * 1e9)
        while len(self._checkpoints) > 1 and self._checkpoints[1][0] <= start:
            self._checkpoints.popleft()

    def totals(self) -> dict[int, SlotWait]:
        """Per slot, since the agent started."""
        return dict(self._totals)

    def recent(self) -> dict[int, SlotWait]:
        """Per slot, over about the last window (since the oldest checkpoint kept)."""
        oldest = self._checkpoints[0][1] if self._checkpoints else {}
        return {slot: t.minus(oldest.get(slot, SlotWait())) for slot, t in self._totals.items()}


def group_waits(sampler: WaitSampler, statuses: tuple[GroupStatus, ...]) -> tuple[GroupWait, ...]:
    """Per group this rank is in (its slot named by the poller), what the sampler measured; groups
    that carry send/recv are left out (their counters count this rank's own p2p ops)."""
    totals, recent = sampler.totals(), sampler.recent()
    out = []
    for g in statuses:
        if g.local_id is None or g.has_p2p or g.local_id not in totals:
            continue
        t, r = totals[g.local_id], recent.get(g.local_id, SlotWait())
        out.append(GroupWait(g.name, g.desc, t.wait_s, t.completed, r.share, r.per_collective_s, r.completed,
                             r.observed_s))
    return tuple(out)
