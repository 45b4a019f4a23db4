"""This rank's incidents: raise one, join the ones others raised, take part, flush (bounded).

Incident numbers are agreed through the store (:mod:`..links.channel`): the first rank to claim
number k raises it, every other rank sees it on its next poll and takes part. The work
itself (dump file, copy to the coordinator: :mod:`.part`; on the raiser the verdict and the trace:
:mod:`.conclude`) runs on one daemon worker thread (:mod:`.worker`), so neither the poll
nor the training thread waits for it unless it asks to (:meth:`IncidentRunner.flush`, bounded).
Each incident's cause is a typed :class:`~fr_otel.incident.trigger.Trigger`, built when this rank raises
and read back from the store's owner record when it joins. The runner knows of the agent only what an
incident needs (:class:`~.rank.IncidentRank`) and the tracker, to tell a stall an incident
already covers from a new one.

Owner records a raiser of this job did not write are skipped, never joined (:mod:`..links.store_trust`);
incidents are capped (``max_incidents``) however joined; a join waits for its verdict only until other
work is queued (a forged incident's verdict never comes: it must not hold up the next one).
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import suppress
from typing import Any

from ...common.log import logger
from ...incident.trigger import Trigger
from ...read.failed import FailedCollective
from ...read.rank_facts import ExitRecord
from ..guest.failure import collective_failure, exit_record, failed_collectives
from ..guest.step_counter import COUNTER
from ..hang_abort import HangAbort, stuck_collectives
from ..links.node_leader import Contact
from ..links.store_link import StoreUnavailable
from ..links.store_trust import owner_problem
from ..observe.poller import ProgressTracker, Stall, stall_trigger
from ..observe.recorder import recorder_entries
from .memory import IncidentMemory
from .part import publish_final, take_part
from .rank import IncidentRank, incident_budget_s
from .worker import IncidentQueue

__all__ = ["ENDING_WINDOW_S", "EXIT_COPY_RESERVE_S", "IncidentRunner"]

#: Seconds of the exit budget kept for this rank's exit copy (one store write, bounded) whatever
#: incident work is still pending: the copy is what later incidents have of a rank that finished early.
EXIT_COPY_RESERVE_S = 1.0

log = logger("fr_otel.agent")

#: A peer that received SIGTERM this recently is the job ending, not a new hang to blame it for.
ENDING_WINDOW_S = 60.0

#: Incident numbers skipped (forged or stale owner records) in one look, or claims lost to them in one raise:
#: a store full of forged owners costs a bounded number of round trips per poll.
MAX_SKIPPED_PER_LOOK = 64


class IncidentRunner:
    """Incident bookkeeping of one rank (numbers seen, stalls covered) and its worker thread."""

    def __init__(self, me: IncidentRank, tracker: ProgressTracker) -> None:
        self.me = me
        self._tracker = tracker
        self._lock = threading.RLock()
        self._known = 0  # highest incident number handled
        self._memory = IncidentMemory()  # what the incidents this rank took part in cover
        self._cap_warned = False
        self._taken = 0  # incidents this rank took part in (what max_incidents caps)
        self._terminating_since: dict[int, float] = {}  # rank -> when this rank first saw its SIGTERM
        self._work = IncidentQueue()
        #: Collectives a failure ended, that the backend recorded as completed (see :mod:`..guest.failure`).
        self.failed: tuple[FailedCollective, ...] = ()
        self._aftermath = False  # this rank is on its way out after a collective's failure or SIGTERM
        #: FR_OTEL_ON_HANG=abort: armed by a hang's verdict, checked on every poll (:meth:`check_abort`).
        self.abort = (HangAbort(me.rank, me.config.abort_after_s, grace_s=max(3 * me.config.poll_interval, 2.0))
                      if me.config.on_hang == "abort" else None)

    # -- on every poll ------------------------------------------------------------------
    def reachable(self) -> bool:
        """False while the channel backs off after repeated store failures (skip the store this poll)."""
        return self.me.channel.reachable()

    def join_open(self, deadline: float | None = None) -> list[threading.Event]:
        """Take part in every incident raised since the last look (one store round trip); on the
        way out, within the exit path's ``deadline``."""
        done: list[threading.Event] = []
        with self._lock:
            skipped = 0
            while skipped < MAX_SKIPPED_PER_LOOK and not self._capped(self._known + 1):
                k = self._known + 1
                record = self.me.channel.owner(k)
                if record is None:
                    break
                trigger = self._trigger(k, record)
                if trigger is None or not self._joinable(trigger):
                    self._known, skipped = k, skipped + 1
                    continue
                done.append(self._take_part(trigger, owner=False, deadline=deadline))
        return done

    def _trigger(self, k: int, record: dict[str, Any]) -> Trigger | None:
        """Incident ``k``'s owner record as its trigger; None (said once: a forgery) when it is not a raiser's."""
        trigger = Trigger.from_record(k, record)
        if trigger is None:
            self.me.channel.forged("incident owner record", f"i/{k}/owner is not a raiser's record; incident {k} "
                                   "is not joined")
        return trigger

    def _joinable(self, trigger: Trigger, *, store: bool = True) -> bool:
        """The incident's owner record is a raiser's of this job, still open (each kind of forgery said once);
        ``store=False``: its shape only (a board's incidents come from this node's leader, who checked the store)."""
        k = trigger.number
        problem = owner_problem(trigger, self.me.rank, self.me.world_size, self.me.channel if store else None)
        if problem is not None and problem[0]:
            self.me.channel.forged(problem[0], f"{problem[1]}; incident {k} is not joined")
        elif problem is not None:  # concluded: too late to join, not too late to be its sequel
            self._memory.saw_concluded(trigger)
        return problem is None

    def _capped(self, k: int) -> bool:
        """This rank took part in ``max_incidents`` incidents already: no more, raised or joined (said once)."""
        if self._taken < self.me.config.max_incidents:
            return False
        if not self._cap_warned:
            self._cap_warned = True
            log.warning("this job reached FR_OTEL_MAX_INCIDENTS=%d: no more incidents are raised or joined "
                        "(the next would be %d)", self.me.config.max_incidents, k)
        return True

    def poll(self, stalls: list[Stall], now_ns: int | None = None) -> None:
        """One poll's incident work: through the store while it answers (or, with node leaders, through
        this node's leader: :mod:`..links.node_leader`); without it, this node's own incident for a stall no
        incident covers yet (see :mod:`.local`). A leader's board says how long each store call may
        take (a slow store must not send its ranks to that store too)."""
        role = self.me.node
        if role is None or not role.leader:
            self._poll(stalls, now_ns)
            return

        def in_store_call(wait_s: float) -> None:
            with self.me.health.guard("writing this node's board"):
                role.publish_board(store_call_s=wait_s)
        with self.me.channel.link.announcing(in_store_call):
            self._poll(stalls, now_ns)

    def _poll(self, stalls: list[Stall], now_ns: int | None) -> None:
        now_ns = time.time_ns() if now_ns is None else now_ns
        step = COUNTER.current  # beside every heartbeat: a lost node is said with the step it was in
        role = self.me.node
        mode = Contact.FLAT
        if role is not None:
            with self.me.health.guard("keeping in touch through this node's leader"):
                try:
                    mode = role.poll(now_ns, step)
                except StoreUnavailable:
                    mode = Contact.BEAT  # the leader's heartbeat found the store down: said by the link
        try:
            if mode is Contact.RELAYED:
                assert role is not None
                if role.board is not None:
                    self.join_board(role.board.incidents)
                if not self.me.hosts.announced and self.reachable():  # once: where this rank runs
                    with self.me.health.guard("saying where this rank runs"), suppress(StoreUnavailable):
                        self.me.hosts.announce()
                if due := role.due_to_raise(self._fresh(stalls)):  # its leader's turn first
                    if not self.reachable() or role.store_down():
                        raise StoreUnavailable("the job's store does not answer")
                    self.raise_for(due)
                return
            if self.reachable():
                with self.me.health.guard("keeping in touch through the store"), suppress(StoreUnavailable):
                    self.me.hosts.poll(now_ns, beat=mode is Contact.FLAT, step=step)
                if mode is not Contact.BEAT:
                    self.join_open()
                self.raise_for(stalls)
                return
        except StoreUnavailable:
            pass  # the link says so once; the stall is handled below, on this node
        finally:
            if role is not None and role.leader:
                with self.me.health.guard("writing this node's board"):
                    role.publish_board()
        fresh = self._fresh(stalls)
        if fresh:
            self.raise_locally(stall_trigger(fresh))

    def join_board(self, incidents: tuple[tuple[int, dict[str, Any]], ...]) -> None:
        """Take part in the incidents this node's leader saw in the store since the last look (no store call)."""
        with self._lock:
            for k, record in incidents:
                if k <= self._known or self._capped(k):
                    continue
                trigger = self._trigger(k, record)
                if k == self._known + 1 and trigger is not None and self._joinable(trigger, store=False):
                    self._take_part(trigger, owner=False)

    def _fresh(self, stalls: list[Stall]) -> list[Stall]:
        return [s for s in stalls if not self._memory.covers(s.key)]

    def raise_for(self, stalls: list[Stall]) -> None:
        """Raise an incident for the oldest stall no incident covers yet (after joining those raised
        meanwhile: another rank saw the same stall first, more often than not), unless it waits on a
        rank that received SIGTERM: that is the job ending, part of the incident that rank was in
        (or of its own SIGTERM incident), never a new one blaming it."""
        if not self._fresh(stalls) or self._next_number() is None:  # at the job's cap: no store call
            return
        with self._lock:
            self.join_open()
            fresh = self._fresh(stalls)
            if not fresh:
                return
            terminating = self._terminating(sorted({r for s in fresh for r in s.group.ranks}))
            if terminating:
                for s in [s for s in fresh if set(s.group.ranks) & set(terminating)]:
                    self._memory.cover(s.key)
                    gone = sorted(set(s.group.ranks) & set(terminating))
                    log.warning("%s #%s on group %s waits on rank(s) %s, which received SIGTERM (during incident "
                                "%s): the job is ending; no new incident", s.group.op or "collective",
                                s.group.inflight_seq, s.group.name, ",".join(map(str, gone)),
                                ",".join(sorted({str(terminating[r] or "none") for r in gone})))
                fresh = [s for s in fresh if not set(s.group.ranks) & set(terminating)]
                if not fresh:
                    return
            self.raise_incident(stall_trigger(fresh))

    def _next_number(self) -> int | None:
        """The next incident number, or None once the job's cap is reached (said once)."""
        k = self._known + 1
        return None if self._capped(k) else k

    def _terminating(self, ranks: list[int]) -> dict[int, int]:
        """Ranks among ``ranks`` that announced SIGTERM less than :data:`ENDING_WINDOW_S` ago (as this
        rank first saw it): after that, a rank still there (its application handled SIGTERM and
        went on) is blamed like any other."""
        now = time.monotonic()
        out = {}
        for rank, incident in self.me.channel.terminating(ranks).items():
            if now - self._terminating_since.setdefault(rank, now) < ENDING_WINDOW_S:
                out[rank] = incident
        return out

    def raise_incident(self, trigger: Trigger, deadline: float | None = None, *,
                       unless_sequel: bool = False) -> threading.Event | None:
        """Raise the next incident for ``trigger`` (or join the one someone raised first); None when capped, when
        the incident its look joined covers the stall ``trigger`` names (another rank raised it in between), or
        (with ``unless_sequel``) when an incident it finds concluded already, looking or losing the claim, makes
        this its :meth:`sequel`."""
        with self._lock:
            self.join_open(deadline)
            if (unless_sequel and self.sequel()) or self._memory.covers_trigger(trigger):
                return None
            for _ in range(MAX_SKIPPED_PER_LOOK):
                k = self._next_number()
                if k is None:
                    return None
                mine = trigger.raised(k, self.me.rank, time.time_ns())
                won, record = self.me.channel.claim(mine)
                owner = self._trigger(k, record)
                if won and owner is not None:
                    log.warning("rank %s raises incident %d: %s", self.me.rank, k, owner.describe())
                    return self._take_part(owner, owner=True, deadline=deadline)
                if owner is not None and self._joinable(owner):  # another rank raised it first: join
                    return self._take_part(owner, owner=False, deadline=deadline)
                self._known = k  # a forged, stale or concluded number: the next one, unless this is its sequel
                if (unless_sequel and self.sequel()) or self._memory.covers_trigger(trigger):  # it concluded on this stall
                    return None
            return None

    def raise_locally(self, trigger: Trigger, deadline: float | None = None) -> threading.Event | None:
        """The job's store does not answer: this node's part of the next incident, without it."""
        k = self._next_number()
        if k is None:
            return None
        mine = trigger.raised(k, self.me.rank, time.time_ns())
        log.warning("rank %s takes part in incident %d without the job's store (%s has not answered for %.0f s): "
                    "%s; this node reports its own part", self.me.rank, k, self.me.channel.address or "the store",
                    self.me.channel.link.unreachable_for_s(), mine.describe())
        return self._take_part(mine, owner=False, deadline=deadline, local=True)

    def _take_part(self, trigger: Trigger, owner: bool, deadline: float | None = None, *,
                   local: bool = False) -> threading.Event:
        k = trigger.number
        self._known = max(self._known, k)
        self._taken += 1
        self._memory.took_part(self._tracker.statuses, trigger)
        if self.me.node is not None and not local:
            self.me.node.incidents.append(trigger)
        if deadline is None:
            deadline = time.monotonic() + incident_budget_s(self.me)
        at = deadline
        stuck = stuck_collectives(self._tracker.statuses, trigger) if self.abort is not None else frozenset()

        def work() -> None:
            with self.me.health.guard(f"incident {k}"), self.me.channel.link.deadline(at):
                summary, files = take_part(self.me, trigger, owner, local, at, self.failed, self._work.queued)
                if self.abort is not None and not self._aftermath:
                    self.abort.arm(k, summary, stuck, files)
        # The raiser's own incident, or this node's without the store, before queued joins.
        return self._work.put(work, 0 if owner or local else 1)

    def check_abort(self) -> None:
        """FR_OTEL_ON_HANG=abort: end this process if an armed hang's collective is still in flight here."""
        if self.abort is not None:
            self.abort.check(self._tracker.statuses)

    # -- asked for: flush, the exit hooks -----------------------------------------------
    def wait_idle(self, timeout: float) -> bool:
        """Wait until no incident work is pending; False on timeout."""
        return self._work.wait_idle(timeout)

    def flush(self, trigger: Trigger, timeout: float | None = None, *, raise_new: bool = True,
              deadline: float | None = None, unless_sequel: bool = False) -> bool:
        """Join any open incident, else raise one (``raise_new``; with ``unless_sequel``, only when this is
        no :meth:`sequel`, judged once the poll thread's lock is held: a join it made meanwhile counts);
        wait, until ``deadline`` (else ``timeout``, else ``flush_timeout`` from now), for this rank's part and
        the verdict if this rank raised it. Never waits past the deadline: not for the store, not for the
        poll thread's lock, not for the work. True when all of it finished."""
        if deadline is None:
            deadline = time.monotonic() + (self.me.config.flush_timeout if timeout is None else timeout)
        with self.me.health.guard(f"flush ({trigger.words})"), self.me.channel.link.deadline(deadline):
            if self._lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
                before = self._taken  # forged owners skipped meanwhile are no incident joined
                raise_new = raise_new and not (unless_sequel and self.sequel())
                try:
                    if not self.reachable():
                        raise StoreUnavailable("the job's store does not answer")
                    self.join_open(deadline)  # may find the incident this is the sequel of concluded already
                    if raise_new and self._taken == before and not (unless_sequel and self.sequel()):
                        self.raise_incident(trigger, deadline=deadline, unless_sequel=unless_sequel)
                except StoreUnavailable:
                    if raise_new and self._taken == before:
                        self.raise_locally(trigger, deadline=deadline)
                finally:
                    self._lock.release()
            return self.wait_idle(deadline - time.monotonic())
        return False

    def sequel(self) -> bool:
        """A failure now belongs to an incident already raised (see :mod:`.memory`): it joins that
        incident (or, concluded already, raises none) rather than raising a new one."""
        return self._memory.sequel(self._tracker.statuses, self.failed, aftermath=self._aftermath)

    def at_exception(self, exc: BaseException, deadline: float) -> None:
        """An uncaught exception in training: raise an incident for it, unless it is a sequel. A
        collective that failed is marked so (its backend records it as completed)."""
        why = collective_failure(exc)
        self.me.leaving.record = exit_record(exc)
        log.debug("at exit after an uncaught exception (a collective failure: %s)", why is not None)
        if why is not None:
            self._aftermath = True
            with self.me.health.guard("reading which collectives the failure ended"):
                self.failed = self._failed_now(why)
            log.debug("collectives the failure ended: %s", [tuple(m[:2]) for m in self.failed])
        self.flush(Trigger.for_exception(exc), unless_sequel=True, deadline=deadline)

    def _failed_now(self, why: str) -> tuple[FailedCollective, ...]:
        in_flight = {g.name: g.inflight_seq for g in self._tracker.statuses if g.inflight_seq is not None}
        return failed_collectives(recorder_entries(self.me.read_recorder()), in_flight, why)

    def at_sigterm(self, deadline: float) -> None:
        """SIGTERM: first tell the peers (while this handler waits for the flush, the main thread
        issues no collective: a peer would otherwise take that for a new hang and blame this rank);
        an incident if a collective no incident covers is in flight; then the exit copy."""
        self._aftermath = True
        self.me.leaving.record = self.me.leaving.record or ExitRecord("sigterm", at_ns=time.time_ns())
        with self.me.health.guard("announcing SIGTERM to the peers"), self.me.channel.link.deadline(deadline):
            self.me.channel.announce_termination(self.me.rank, self._known)
        stuck = any(g.inflight_seq is not None and not self._memory.covers(g.stall_key) for g in self._tracker.statuses)
        self.flush(Trigger.for_sigterm(stuck), raise_new=stuck, unless_sequel=True, deadline=deadline - EXIT_COPY_RESERVE_S)
        self.leave_exit_copy(deadline)

    def at_exit(self, deadline: float) -> None:
        """Normal exit: let pending work finish (bounded, keeping the exit copy's time: a rank waiting
        for a verdict must not spend the whole budget), then leave this rank's exit copy."""
        self.me.leaving.record = self.me.leaving.record or ExitRecord("exit", at_ns=time.time_ns())
        self.wait_idle(deadline - EXIT_COPY_RESERVE_S - time.monotonic())
        self.leave_exit_copy(deadline)

    def leave_exit_copy(self, deadline: float) -> None:
        with self.me.health.guard("leaving the exit copy", level=logging.DEBUG), \
                self.me.channel.link.deadline(deadline):
            publish_final(self.me, self.failed)

    def stop(self, timeout: float) -> None:
        """End the worker thread (after the work already queued)."""
        self._work.stop(timeout)

