"""This rank's incidents: raise one, join the ones others raised, take part, flush (bounded).

Incident numbers are agreed through the store (:mod:`.channel`): the first rank to claim
number k raises it, every other rank sees it on its next poll and takes part. The work
itself (dump file, copy to the coordinator, and on the raiser the verdict and the trace:
:mod:`.incident_work`) runs on one daemon worker thread, so neither the poll nor the
training thread waits for it unless it asks to (:meth:`IncidentRunner.flush`, bounded).
The runner knows of the agent only what an incident needs
(:class:`~.incident_work.IncidentRank`) and the tracker, to tell a stall an incident
already covers from a new one.
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import time
from contextlib import suppress
from typing import Any

from ..common.ids import trace_id_for
from ..common.log import logger
from ..common.text import one_line
from ..read.failed import FailedCollective
from .failure import collective_failure, failed_collectives
from .incident_rank import IncidentRank
from .incident_work import flush_incident, incident_budget_s, own_part, publish_final
from .local_incident import take_part_locally
from .poller import ProgressTracker, Stall
from ..common.gc_pause import gc_paused
from .step_counter import COUNTER
from .store_gather import read_heartbeats
from .store_link import StoreUnavailable

__all__ = ["ENDING_WINDOW_S", "EXIT_COPY_RESERVE_S", "SEQUEL_WINDOW_S", "IncidentRunner"]

#: Seconds of the exit budget kept for this rank's exit copy (one store write, bounded) whatever
#: incident work is still pending: the copy is what later incidents have of a rank that finished early.
EXIT_COPY_RESERVE_S = 1.0

log = logger("fr_otel.agent")

#: A crash this soon after taking part in an incident is most likely its sequel, even when the
#: collectives it covered moved on.
SEQUEL_WINDOW_S = 10.0
#: A peer that received SIGTERM this recently is the job ending, not a new hang to blame it for.
ENDING_WINDOW_S = 60.0

_Job = tuple[int, dict[str, Any], bool, bool, float, threading.Event]  # k, meta, owner, local, deadline, done


class IncidentRunner:
    """Incident bookkeeping of one rank (numbers seen, stalls covered) and its worker thread."""

    def __init__(self, me: IncidentRank, tracker: ProgressTracker) -> None:
        self.me = me
        self._tracker = tracker
        self._lock = threading.RLock()
        self._known = 0  # highest incident number handled
        self._covered: set[tuple[str, int]] = set()  # (group, seq) some incident already covers
        self._cap_warned = False
        self._last_taken_part = float("-inf")  # monotonic time this rank last took part in one
        self._terminating_since: dict[int, float] = {}  # rank -> when this rank first saw its SIGTERM
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._pending = 0
        self._idle = threading.Condition()
        #: Collectives a failure ended, that the backend recorded as completed (see :mod:`.failure`).
        self.failed: tuple[FailedCollective, ...] = ()

    # -- on every poll ------------------------------------------------------------------
    def reachable(self) -> bool:
        """False while the channel backs off after repeated store failures (skip the store this poll)."""
        return self.me.channel.reachable()

    def join_open(self, deadline: float | None = None) -> list[threading.Event]:
        """Take part in every incident raised since the last look (one store round trip); on the
        way out, within the exit path's ``deadline``."""
        done: list[threading.Event] = []
        with self._lock:
            while True:
                k = self._known + 1
                meta = self.me.channel.owner(k)
                if meta is None:
                    return done
                done.append(self._take_part(k, meta, owner=meta.get("rank") == self.me.rank, deadline=deadline))

    def poll(self, stalls: list[Stall], now_ns: int | None = None) -> None:
        """One poll's incident work: through the store while it answers (or, with node leaders, through
        this node's leader: :mod:`.node_leader`); without it, this node's own incident for a stall no
        incident covers yet (see :mod:`.local_incident`). A leader's board says how long each store call may
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
        mode = "flat"
        if role is not None:
            with self.me.health.guard("keeping in touch through this node's leader"):
                try:
                    mode = role.poll(now_ns, step)
                except StoreUnavailable:
                    mode = "beat"  # the leader's heartbeat found the store down: said by the link
        try:
            if mode == "relayed":
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
                    self.me.hosts.poll(now_ns, beat=mode == "flat", step=step)
                if mode != "beat":
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
            self.raise_locally("stall", _stall_detail(fresh))

    def join_board(self, incidents: tuple[tuple[int, dict[str, Any]], ...]) -> None:
        """Take part in the incidents this node's leader saw in the store since the last look (no store call)."""
        with self._lock:
            for k, meta in incidents:
                if k == self._known + 1:
                    self._take_part(k, meta, owner=meta.get("rank") == self.me.rank)

    def _fresh(self, stalls: list[Stall]) -> list[Stall]:
        return [s for s in stalls if s.key not in self._covered]

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
                    if s.group.inflight_seq is not None:  # a stall's always is (as where incidents are raised)
                        self._covered.add((s.group.name, s.group.inflight_seq))
                    gone = sorted(set(s.group.ranks) & set(terminating))
                    log.warning("%s #%s on group %s waits on rank(s) %s, which received SIGTERM (during incident "
                                "%s): the job is ending; no new incident", s.group.op or "collective",
                                s.group.inflight_seq, s.group.name, ",".join(map(str, gone)),
                                ",".join(sorted({str(terminating[r] or "none") for r in gone})))
                fresh = [s for s in fresh if not set(s.group.ranks) & set(terminating)]
                if not fresh:
                    return
            self.raise_incident("stall", _stall_detail(fresh))

    def _next_number(self) -> int | None:
        """The next incident number, or None once the job's cap is reached (said once)."""
        k = self._known + 1
        if k > self.me.config.max_incidents:
            if not self._cap_warned:
                self._cap_warned = True
                log.warning("this job reached FR_OTEL_MAX_INCIDENTS=%d: no more incidents are raised",
                            self.me.config.max_incidents)
            return None
        return k

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

    def raise_incident(self, reason: str, detail: dict[str, Any] | None = None,
                       deadline: float | None = None) -> threading.Event | None:
        """Raise the next incident (or join the one someone raised first); None when capped."""
        with self._lock:
            self.join_open(deadline)
            k = self._next_number()
            if k is None:
                return None
            meta = {"rank": self.me.rank, "reason": reason, "time_ns": time.time_ns(), **(detail or {})}
            won, owner_meta = self.me.channel.claim(k, meta)
            if won:
                log.warning("rank %s raises incident %d: %s", self.me.rank, k, _describe(meta))
            return self._take_part(k, owner_meta, owner=won, deadline=deadline)

    def raise_locally(self, reason: str, detail: dict[str, Any] | None = None,
                      deadline: float | None = None) -> threading.Event | None:
        """The job's store does not answer: this node's part of the next incident, without it."""
        k = self._next_number()
        if k is None:
            return None
        meta = {"rank": self.me.rank, "reason": reason, "time_ns": time.time_ns(), **(detail or {})}
        log.warning("rank %s takes part in incident %d without the job's store (%s has not answered for %.0f s): "
                    "%s; this node reports its own part", self.me.rank, k, self.me.channel.address or "the store",
                    self.me.channel.link.unreachable_for_s(), _describe(meta))
        return self._take_part(k, meta, owner=False, deadline=deadline, local=True)

    def _take_part(self, k: int, meta: dict[str, Any], owner: bool, deadline: float | None = None, *,
                   local: bool = False) -> threading.Event:
        self._known = max(self._known, k)
        self._last_taken_part = time.monotonic()
        if self.me.node is not None and not local:
            self.me.node.incidents.append((k, meta))
        for g in self._tracker.statuses:  # what is stuck now is this incident's business
            if g.inflight_seq is not None:
                self._covered.add((g.name, g.inflight_seq))
        stalled = (meta.get("pg_name"), meta.get("seq"))  # and the collective it was raised for, which this
        if isinstance(stalled[0], str) and type(stalled[1]) is int:  # rank may not have entered yet
            self._covered.add((stalled[0], stalled[1]))
        if deadline is None:
            deadline = time.monotonic() + incident_budget_s(self.me)
        done = threading.Event()
        with self._idle:
            self._pending += 1
        self._jobs.put((k, meta, owner, local, deadline, done))
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="fr-otel-flush", daemon=True)
            self._worker.start()
        return done

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            k, meta, owner, local, deadline, done = job
            try:
                with self.me.health.guard(f"incident {k}"), self.me.channel.link.deadline(deadline):
                    self._part(k, meta, owner, local, deadline)
            finally:
                done.set()
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _part(self, k: int, meta: dict[str, Any], owner: bool, local: bool, deadline: float) -> None:
        """This rank's part in incident ``k``: through the store while it answers; when it fails during
        the incident (its host went with the fault), this node's part without it, same number."""
        trace_hex = f"{trace_id_for(self.me.job_id, str(k)):032x}"
        self.me.channel.forget_heard()  # a local verdict says only what was heard during this incident
        if owner and not local:  # while the store answers: when every rank was last heard, for a local verdict
            with self.me.health.guard("reading the heartbeats"), suppress(StoreUnavailable):
                read_heartbeats(self.me)  # node leaders' heartbeats too
        part = own_part(self.me, trace_hex, self.failed)
        self.me.health.incident(trace_hex)
        if not local:
            try:
                flush_incident(self.me, k, meta, owner, deadline, part)
                return
            except StoreUnavailable as exc:
                log.warning("incident %d: the job's store went away during it (%s); this node reports its own part",
                            k, one_line(exc, 200))
                if self.me.node is not None:
                    with self.me.health.guard("telling this node's ranks"):
                        self.me.node.ended_as(k, verdict=False)  # a leader's ranks go on without the store too
        take_part_locally(self.me, k, meta, deadline, part)

    # -- asked for: flush, the exit hooks -----------------------------------------------
    def wait_idle(self, timeout: float) -> bool:
        """Wait until no incident work is pending; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, max(timeout, 0.0))

    def flush(self, reason: str, timeout: float | None = None, *, raise_new: bool = True,
              deadline: float | None = None) -> bool:
        """Join any open incident, else raise one (``raise_new``); wait, until ``deadline`` (else
        ``timeout``, else ``flush_timeout`` from now), for this rank's part and the verdict if this
        rank raised it. Never waits past the deadline: not for the store, not for the poll thread's
        lock, not for the work. True when all of it finished."""
        if deadline is None:
            deadline = time.monotonic() + (self.me.config.flush_timeout if timeout is None else timeout)
        with self.me.health.guard(f"flush ({reason})"), self.me.channel.link.deadline(deadline):
            if self._lock.acquire(timeout=max(deadline - time.monotonic(), 0.0)):
                before = self._known
                try:
                    if not self.reachable():
                        raise StoreUnavailable("the job's store does not answer")
                    self.join_open(deadline)
                    if raise_new and self._known == before:
                        self.raise_incident(reason, deadline=deadline)
                except StoreUnavailable:
                    if raise_new and self._known == before:
                        self.raise_locally(reason, deadline=deadline)
                finally:
                    self._lock.release()
            return self.wait_idle(deadline - time.monotonic())
        return False

    def unresolved(self) -> bool:
        """An incident this rank took part in still stands: a collective it covers has not been
        followed by a later one on this rank (a backend that gave up on it retires it as if it had
        completed: gloo after its timeout, NCCL on abort; only progress past it resolves it)."""
        if not self._covered:
            return False
        done = {g.name: g.completed for g in self._tracker.statuses}
        return any(name in done and done[name] <= seq for name, seq in self._covered)

    def sequel(self) -> bool:
        """A failure now belongs to the incident already open (its watchdog's abort, a peer that
        went away): it joins that incident rather than raising a new one."""
        return self.unresolved() or time.monotonic() - self._last_taken_part < SEQUEL_WINDOW_S

    def at_exception(self, exc: BaseException, deadline: float) -> None:
        """An uncaught exception in training: raise an incident for it, unless it is a sequel. A
        collective that failed is marked so (its backend records it as completed)."""
        reason = f"uncaught {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        why = collective_failure(exc)
        log.debug("at exit after an uncaught exception (a collective failure: %s)", why is not None)
        if why is not None:
            with self.me.health.guard("reading which collectives the failure ended"):
                self.failed = self._failed_now(why)
            log.debug("collectives the failure ended: %s", [tuple(m[:2]) for m in self.failed])
        self.flush(reason, raise_new=not self.sequel(), deadline=deadline)

    def _failed_now(self, why: str) -> tuple[FailedCollective, ...]:
        in_flight = {g.name: g.inflight_seq for g in self._tracker.statuses if g.inflight_seq is not None}
        with gc_paused():
            entries = pickle.loads(self.me.read_recorder()).get("entries") or []  # this process's own bytes
        return failed_collectives(entries, in_flight, why)

    def at_sigterm(self, deadline: float) -> None:
        """SIGTERM: first tell the peers (while this handler waits for the flush, the main thread
        issues no collective: a peer would otherwise take that for a new hang and blame this rank);
        an incident if a collective no incident covers is in flight; then the exit copy."""
        with self.me.health.guard("announcing SIGTERM to the peers"), self.me.channel.link.deadline(deadline):
            self.me.channel.announce_termination(self.me.rank, self._known)
        stuck = any(g.inflight_seq is not None and (g.name, g.inflight_seq) not in self._covered
                    for g in self._tracker.statuses)
        self.flush("SIGTERM while a collective was in flight" if stuck else "SIGTERM",
                   raise_new=stuck and not self.sequel(), deadline=deadline - EXIT_COPY_RESERVE_S)
        self.leave_exit_copy(deadline)

    def at_exit(self, deadline: float) -> None:
        """Normal exit: let pending work finish (bounded, keeping the exit copy's time: a rank waiting
        for a verdict must not spend the whole budget), then leave this rank's exit copy."""
        self.wait_idle(deadline - EXIT_COPY_RESERVE_S - time.monotonic())
        self.leave_exit_copy(deadline)

    def leave_exit_copy(self, deadline: float) -> None:
        with self.me.health.guard("leaving the exit copy", level=logging.DEBUG), \
                self.me.channel.link.deadline(deadline):
            publish_final(self.me, self.failed)

    def stop(self, timeout: float) -> None:
        """End the worker thread (after the work already queued)."""
        if self._worker is not None:
            self._jobs.put(None)
            if self._worker is not threading.current_thread():
                self._worker.join(timeout)
            self._worker = None


def _stall_detail(fresh: list[Stall]) -> dict[str, Any]:
    """The incident's detection record for the oldest of ``fresh`` stalls."""
    s = max(fresh, key=lambda s: s.age_s)
    g = s.group
    return {"pg_name": g.name, "pg_desc": g.desc, "seq": g.inflight_seq, "op": g.op, "age_s": round(s.age_s, 3),
            "threshold_s": round(s.threshold_s, 3)}


def _describe(meta: dict[str, Any]) -> str:
    """An incident's owner record as a sentence for the log."""
    if "pg_name" in meta:
        return (f"{meta.get('op') or 'collective'} #{meta.get('seq')} on group {meta.get('pg_name')} "
                f"({meta.get('pg_desc', '')}) in flight {meta.get('age_s')} s (threshold {meta.get('threshold_s')} s)")
    return str(meta.get("reason", ""))
