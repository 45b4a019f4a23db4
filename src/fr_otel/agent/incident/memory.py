"""What a rank remembers of the incidents it took part in, to tell a sequel from a new incident.

A hang's aftermath comes later than the hang and from elsewhere: the watchdog's abort, a collective
that fails because a peer went away, SIGTERM from the launcher. Each reaches every rank on its own
schedule (a rank in its data loading when a host crashed fails in its next collective, seconds or
a timeout later, when the first incident may be over), and none of them is a new incident. So a
failure is a sequel while an incident this rank took part in still stands: a collective it covered
was never followed by a later one, or the part was taken moments ago. A collective's failure, or
SIGTERM, is one too while this rank has completed no collective since, save the ones the failure
itself ended (a backend retires a failed collective as if it had completed: gloo after its timeout,
NCCL on abort), or while an incident another rank raised moments ago has concluded already (a crash's
survivors fail within a second or two of each other, and its raiser may gather and conclude in between);
an exception of the training code's own then is a new incident. Groups that carry
send/recv are left out of that count: their counter is this rank's p2p count, and the failure marks
never name their ops, so a retired send would pass for progress.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from ...incident.trigger import Trigger
from ...read.failed import FailedCollective
from ..observe.state import GroupStatus

__all__ = ["SEQUEL_WINDOW_S", "IncidentMemory"]

#: A crash this soon after taking part in an incident is most likely its sequel, even when the
#: collectives it covered moved on.
SEQUEL_WINDOW_S = 10.0


class IncidentMemory:
    """The collectives earlier incidents cover, when this rank last took part, and how far it had come."""

    def __init__(self) -> None:
        self.covered: set[tuple[str, int]] = set()  # (group, seq) some incident already covers
        self.last_taken_part = float("-inf")  # monotonic time this rank last took part in one
        self._completed_then: dict[str, int] | None = None  # each group's last completed seq at that part
        self._concluded_raised_ns: int | None = None  # when the newest concluded incident seen was raised
        self._started_ns = time.time_ns()
        #: (group, seq) that incidents raised during this run, concluded before this rank looked, were raised for:
        #: no new incident for them, but no sequel either (this rank took no part).
        self._concluded_stalls: set[tuple[str, int]] = set()

    def took_part(self, statuses: Iterable[GroupStatus], trigger: Trigger) -> None:
        """This rank takes part in an incident: what is stuck now is that incident's business, and so is the
        collective it was raised for, which this rank may not have entered yet."""
        self.last_taken_part = time.monotonic()
        self._completed_then = {}
        for g in statuses:
            self._completed_then[g.name] = g.completed
            self.cover(g.stall_key)
        stalled = _stall_of(trigger)
        if stalled is not None:
            self.covered.add(stalled)

    def cover(self, key: tuple[str, int | None]) -> None:
        """An incident (or the job's end) covers the stall on (group, seq) ``key``; nothing when no seq is in flight."""
        if key[1] is not None:
            self.covered.add((key[0], key[1]))

    def saw_concluded(self, trigger: Trigger) -> None:
        """An incident this rank did not take part in, concluded already. Raised during this run (not an earlier
        run's leftover in the store), the collective it was raised for is not raised again: a rank that looks
        only after the verdict, late under load, raises no second incident."""
        when = trigger.time_ns
        if self._concluded_raised_ns is None or when > self._concluded_raised_ns:
            self._concluded_raised_ns = when
        stalled = _stall_of(trigger)
        if stalled is not None and when >= self._started_ns:
            self._concluded_stalls.add(stalled)

    def covers(self, key: tuple[str, int | None]) -> bool:
        """An incident covers the stall on (group, seq) ``key``: one this rank took part in, or one raised during
        this run for it that concluded before this rank looked."""
        return key in self.covered or key in self._concluded_stalls

    def covers_trigger(self, trigger: Trigger) -> bool:
        """:meth:`covers` the stall ``trigger`` names."""
        stalled = _stall_of(trigger)
        return stalled is not None and self.covers(stalled)

    def unresolved(self, statuses: Iterable[GroupStatus]) -> bool:
        """A collective an incident covers has not been followed by a later one on this rank (only
        progress past it resolves it: a backend that gave up on it retires it as if it had completed)."""
        if not self.covered:
            return False
        done = {g.name: g.completed for g in statuses}
        return any(name in done and done[name] <= seq for name, seq in self.covered)

    def progressed(self, statuses: Iterable[GroupStatus], failed: Iterable[FailedCollective]) -> bool:
        """Some collective completed on this rank since it last took part, other than one a failure ended."""
        if self._completed_then is None:
            return True
        ended = {(f.group, f.seq) for f in failed}
        for g in statuses:
            if g.has_p2p:
                continue
            then = self._completed_then.get(g.name, 0)
            if any((g.name, seq) not in ended for seq in range(then + 1, g.completed + 1)):
                return True
        return False

    def sequel(self, statuses: Iterable[GroupStatus], failed: Iterable[FailedCollective], *,
               aftermath: bool) -> bool:
        """A failure now belongs to an incident this rank took part in, rather than being a new one;
        ``aftermath``: it is a collective's failure or SIGTERM, which no progress since also ties to it."""
        groups = list(statuses)
        raised = self._concluded_raised_ns
        recent = raised is not None and 0 <= time.time_ns() - raised < SEQUEL_WINDOW_S * 1e9  # never future-dated
        return (self.unresolved(groups) or time.monotonic() - self.last_taken_part < SEQUEL_WINDOW_S
                or (aftermath and (not self.progressed(groups, failed) or recent)))


def _stall_of(trigger: Trigger) -> tuple[str, int] | None:
    """The (group, seq) an incident was raised for (a stall's), if any."""
    s = trigger.stall
    return (s.pg_name, s.seq) if s is not None and s.seq is not None else None
