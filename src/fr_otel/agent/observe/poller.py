"""From cheap progress counters to per-group in-flight state, refined only when it matters.

Each poll gives, per recorder slot, the last enqueued and last completed sequence numbers
(the ~0 ms read). When the first differs from the second, collective ``completed + 1`` is
in flight; the poll that first sees it stamps it (so its age is known to within one poll
interval, never overstated). Once it has been in flight ``refine_after_s``, one full read
(:meth:`~.recorder.Recorder.in_flight`) gives its exact enqueue time, op and timeout, and corrects two
things counters cannot: gloo's worker threads can record completions out of order, leaving
``last_completed`` one behind for good (the entry, retired, tells the truth); and the
slot -> group pairing, which the entries name. Only a refined collective can raise an
incident. Pure bookkeeping: no torch, no threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...diagnosis.pace import stall_threshold_s as _stall_rule
from ...incident.trigger import SeenStall, Trigger
from .recorder import GroupInfo, InFlightEntry, P2PInFlightEntry
from .state import GroupStatus, P2PWait

__all__ = ["ProgressTracker", "Stall", "stall_threshold_s", "stall_trigger"]


def stall_threshold_s(stall_seconds: float, timeout_ms: int | None) -> float:
    """min(the configured stall time, half the collective's own timeout): the offline rule
    (:func:`fr_otel.diagnosis.pace.stall_threshold_s`) for a job whose pace the agent has not
    learnt (it reads its full recorder only when something is suspect)."""
    return _stall_rule(timeout_ms, None, stall_seconds)


@dataclass(frozen=True, slots=True)
class Stall:
    """A collective in flight past its threshold on this rank."""

    group: GroupStatus
    age_s: float
    threshold_s: float
    #: Which stall this is: its group and the collective in flight there (what an incident covers), taken
    #: once from the group (:attr:`~.state.GroupStatus.stall_key`): every incident check asks for it.
    key: tuple[str, int | None] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", self.group.stall_key)


def stall_trigger(stalls: list[Stall]) -> Trigger:
    """The trigger of an incident for the oldest of ``stalls``: what the raiser saw of it."""
    s = max(stalls, key=lambda s: s.age_s)
    g = s.group
    return Trigger.for_stall(SeenStall(g.name, g.inflight_seq, g.op, round(s.age_s, 3), g.desc), round(s.threshold_s, 3))


class ProgressTracker:
    """Turns successive progress readings (and the occasional full read) into group states."""

    def __init__(self) -> None:
        self._groups: tuple[GroupInfo, ...] = ()
        self._slot_names: dict[int, str] = {}  # learned from entries: authoritative
        self._first_seen: dict[int, tuple[int, int]] = {}  # slot -> (seq, first seen ns)
        self._exact: dict[int, InFlightEntry] = {}
        self._done_floor: dict[int, int] = {}  # slot -> seq the entries show completed
        self._refined: set[tuple[int, int]] = set()  # (slot, seq) already read in full
        self._progress: dict[int, tuple[int, int]] = {}
        self._p2p_slots: set[int] = set()  # slots seen carrying send/recv: counters mix p2p counts
        self._p2p: dict[int, tuple[P2PInFlightEntry, ...]] = {}  # pending send/recv at the last full read
        self.statuses: tuple[GroupStatus, ...] = ()

    def set_groups(self, groups: tuple[GroupInfo, ...]) -> None:
        self._groups = groups

    def _slots(self) -> dict[int, GroupInfo]:
        by_name = {g.name: g for g in self._groups}
        slots: dict[int, GroupInfo] = {}
        for g in self._groups:
            if g.local_id is not None:
                slots[g.local_id] = g
        for slot, name in self._slot_names.items():  # entries override the creation-order guess
            named = by_name.get(name)
            if named is not None:
                for other in [s for s, v in slots.items() if v.name == name and s != slot]:
                    del slots[other]
                slots[slot] = named
        return slots

    def update(self, progress: dict[int, tuple[int, int]], now_ns: int) -> tuple[GroupStatus, ...]:
        """Fold in one progress reading; returns every group's state (members without
        collectives yet report 0/0, so a rank stuck before its first one still has a series)."""
        self._progress = progress
        out: list[GroupStatus] = []
        for slot, g in sorted(self._slots().items()):
            enq, done = progress.get(slot, (0, 0))
            p2p = slot in self._p2p_slots
            waits = self._p2p_waits(slot, g) if p2p and enq > done else ()
            if p2p and enq <= done:
                self._p2p.pop(slot, None)
            done = self.completed(slot, enq, done)
            if enq > done:
                seq = done + 1
                seen = self._first_seen.get(slot)
                if seen is None or seen[0] != seq:
                    self._first_seen[slot] = seen = (seq, now_ns)
                exact = self._exact.get(slot)
                if exact is not None and exact.seq == seq and exact.created_ns:
                    out.append(GroupStatus(g.name, g.desc, g.ranks, slot, enq, done, seq, exact.created_ns, True,
                                           exact.op, exact.timeout_ms, has_p2p=p2p, p2p=waits))
                else:
                    out.append(GroupStatus(g.name, g.desc, g.ranks, slot, enq, done, seq, seen[1],
                                           has_p2p=p2p, p2p=waits))
            else:
                self._first_seen.pop(slot, None)
                self._exact.pop(slot, None)
                out.append(GroupStatus(g.name, g.desc, g.ranks, slot, enq, done, has_p2p=p2p))
        self.statuses = tuple(out)
        if len(self._refined) > 256:  # forget collectives long completed
            self._refined = {(s, q) for s, q in self._refined if q > progress.get(s, (0, 0))[1]}
        return self.statuses

    def completed(self, slot: int, enqueued: int, completed: int) -> int:
        """``completed`` as the last full read corrects it: gloo can leave the counter one behind
        for good (completions recorded out of order), where the retired entry tells the truth."""
        floor = self._done_floor.get(slot)
        return max(completed, floor) if floor is not None and floor <= enqueued else completed

    def _p2p_waits(self, slot: int, g: GroupInfo) -> tuple[P2PWait, ...]:
        """Pending send/recv with the peer's global rank (group-local rank -> member list)."""
        out = []
        for e in self._p2p.get(slot, ()):
            peer = g.ranks[e.peer_local] if e.peer_local is not None and e.peer_local < len(g.ranks) else None
            if e.peer_local is not None and peer is None:
                continue  # the member list does not fit: do not guess a peer
            out.append(P2PWait(e.op, peer, e.created_ns))
        return tuple(out)

    def needs_refine(self, now_ns: int, after_s: float) -> bool:
        """Some collective has been in flight ``after_s`` and was never read in full."""
        return any(
            g.inflight_since_ns is not None and not g.exact and (g.local_id, g.inflight_seq) not in self._refined
            and g.age_s(now_ns) >= after_s
            for g in self.statuses
        )

    def apply_refine(
        self, pending: dict[int, InFlightEntry], done: dict[int, int], slots: dict[int, str], now_ns: int,
        p2p: dict[int, tuple[P2PInFlightEntry, ...]] | None = None,
    ) -> tuple[GroupStatus, ...]:
        """Fold in one full read (see :func:`~fr_otel.agent.observe.recorder.scan_entries` and ``scan_p2p``)."""
        self._slot_names.update(slots)
        if p2p is not None:
            self._p2p = dict(p2p)
            self._p2p_slots.update(p2p)
            self._slot_names.update({slot: v[0].pg_name for slot, v in p2p.items() if v})
        for g in self.statuses:
            if g.inflight_seq is not None and g.local_id is not None:
                self._refined.add((g.local_id, g.inflight_seq))
        for slot, entry in pending.items():
            self._exact[slot] = entry
            self._done_floor[slot] = entry.seq - 1
        for slot, seq in done.items():
            self._done_floor[slot] = seq
        return self.update(self._progress, now_ns)

    def stalls(self, now_ns: int, stall_seconds: float) -> list[Stall]:
        """Refined collectives past their threshold; unrefinable ones past ``stall_seconds``."""
        out = []
        for g in self.statuses:
            if g.inflight_since_ns is None:
                continue
            if not g.exact and (g.local_id, g.inflight_seq) not in self._refined:
                continue  # not confirmed yet: counters alone can lag (see the module doc)
            threshold = stall_threshold_s(stall_seconds, g.timeout_ms if g.exact else None)
            age = g.age_s(now_ns)
            if age >= threshold:
                out.append(Stall(g, age, threshold))
        return out
