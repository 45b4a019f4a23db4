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
import queue
import threading
import time
from typing import Any

from .incident_work import IncidentRank, flush_incident, publish_final
from .poller import ProgressTracker, Stall

__all__ = ["SEQUEL_WINDOW_S", "IncidentRunner"]

log = logging.getLogger("fr_otel.agent")

#: A crash this soon after taking part in an incident is most likely its sequel.
SEQUEL_WINDOW_S = 60.0

_Job = tuple[int, dict[str, Any], bool, float, threading.Event]


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

    # -- on every poll ------------------------------------------------------------------
    def reachable(self) -> bool:
        """False while the channel backs off after repeated store failures (skip the store this poll)."""
        return self.me.channel.reachable()

    def join_open(self) -> list[threading.Event]:
        """Take part in every incident raised since the last look (one store round trip)."""
        done: list[threading.Event] = []
        with self._lock:
            while True:
                k = self._known + 1
                meta = self.me.channel.owner(k)
                if meta is None:
                    return done
                done.append(self._take_part(k, meta, owner=meta.get("rank") == self.me.rank))

    def raise_for(self, stalls: list[Stall]) -> None:
        """Raise an incident for the oldest stall no incident covers yet, unless it waits on a
        rank that received SIGTERM: that is the job ending, part of the incident that rank was in
        (or of its own SIGTERM incident), never a new one blaming it."""
        fresh = [s for s in stalls if (s.group.name, s.group.inflight_seq) not in self._covered]
        if not fresh:
            return
        terminating = self._terminating(sorted({r for s in fresh for r in s.group.ranks}))
        if terminating:
            for s in [s for s in fresh if set(s.group.ranks) & set(terminating)]:
                self._covered.add((s.group.name, s.group.inflight_seq))
                gone = sorted(set(s.group.ranks) & set(terminating))
                log.warning("%s #%s on group %s waits on rank(s) %s, which received SIGTERM (during incident %s): "
                            "the job is ending; no new incident", s.group.op or "collective", s.group.inflight_seq,
                            s.group.name, ",".join(map(str, gone)),
                            ",".join(sorted({str(terminating[r] or "none") for r in gone})))
            fresh = [s for s in fresh if not set(s.group.ranks) & set(terminating)]
            if not fresh:
                return
        s = max(fresh, key=lambda s: s.age_s)
        g = s.group
        self.raise_incident("stall", {"pg_name": g.name, "pg_desc": g.desc, "seq": g.inflight_seq, "op": g.op,
                                      "age_s": round(s.age_s, 3), "threshold_s": round(s.threshold_s, 3)})

    def _terminating(self, ranks: list[int]) -> dict[int, int]:
        """Ranks among ``ranks`` that announced SIGTERM less than :data:`SEQUEL_WINDOW_S` ago (as this
        rank first saw it): after that, a rank still there (its application handled SIGTERM and
        went on) is blamed like any other."""
        now = time.monotonic()
        out = {}
        for rank, incident in self.me.channel.terminating(ranks).items():
            if now - self._terminating_since.setdefault(rank, now) < SEQUEL_WINDOW_S:
                out[rank] = incident
        return out

    def raise_incident(self, reason: str, detail: dict[str, Any] | None = None,
                       deadline: float | None = None) -> threading.Event | None:
        """Raise the next incident (or join the one someone raised first); None when capped."""
        with self._lock:
            self.join_open()
            k = self._known + 1
            if k > self.me.config.max_incidents:
                if not self._cap_warned:
                    self._cap_warned = True
                    log.warning("this job reached FR_OTEL_MAX_INCIDENTS=%d: no more incidents are raised",
                                self.me.config.max_incidents)
                return None
            meta = {"rank": self.me.rank, "reason": reason, "time_ns": time.time_ns(), **(detail or {})}
            won, owner_meta = self.me.channel.claim(k, meta)
            if won:
                log.warning("rank %s raises incident %d: %s", self.me.rank, k, _describe(meta))
            return self._take_part(k, owner_meta, owner=won, deadline=deadline)

    def _take_part(self, k: int, meta: dict[str, Any], owner: bool, deadline: float | None = None) -> threading.Event:
        self._known = max(self._known, k)
        self._last_taken_part = time.monotonic()
        for g in self._tracker.statuses:  # what is stuck now is this incident's business
            if g.inflight_seq is not None:
                self._covered.add((g.name, g.inflight_seq))
        if deadline is None:
            deadline = time.monotonic() + self.me.config.gather_seconds + self.me.export_config.timeout_s + 5
        done = threading.Event()
        with self._idle:
            self._pending += 1
        self._jobs.put((k, meta, owner, deadline, done))
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="fr-otel-flush", daemon=True)
            self._worker.start()
        return done

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            k, meta, owner, deadline, done = job
            try:
                with self.me.health.guard(f"incident {k}"):
                    flush_incident(self.me, k, meta, owner, deadline)
            finally:
                done.set()
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    # -- asked for: flush, the exit hooks -----------------------------------------------
    def wait_idle(self, timeout: float) -> bool:
        """Wait until no incident work is pending; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def flush(self, reason: str, timeout: float | None = None, *, raise_new: bool = True) -> bool:
        """Join any open incident, else raise one (``raise_new``); wait (bounded) for this
        rank's part, and the verdict if this rank raised it. True when all of it finished."""
        timeout = self.me.config.flush_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self.me.health.guard(f"flush ({reason})"):
            with self._lock:
                before = self._known
                self.join_open()
                if raise_new and self._known == before:
                    self.raise_incident(reason, deadline=deadline)
            return self.wait_idle(max(deadline - time.monotonic(), 0))
        return False

    def recent(self) -> bool:
        """Took part in an incident within the last minute: a crash now is most likely its sequel
        (a peer that went away makes gloo raise here), so it joins rather than raises."""
        return time.monotonic() - self._last_taken_part < SEQUEL_WINDOW_S

    def at_exception(self, exc: BaseException) -> None:
        """An uncaught exception in training: raise an incident for it, unless it is a sequel."""
        reason = f"uncaught {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        self.flush(reason, raise_new=not self.recent())

    def at_sigterm(self) -> None:
        """SIGTERM: first tell the peers (while this handler waits for the flush, the main thread
        issues no collective: a peer would otherwise take that for a new hang and blame this rank);
        an incident if a collective no incident covers is in flight; then the exit copy."""
        with self.me.health.guard("announcing SIGTERM to the peers"):
            self.me.channel.announce_termination(self.me.rank, self._known)
        stuck = any(g.inflight_seq is not None and (g.name, g.inflight_seq) not in self._covered
                    for g in self._tracker.statuses)
        self.flush("SIGTERM while a collective was in flight" if stuck else "SIGTERM",
                   raise_new=stuck and not self.recent())
        with self.me.health.guard("flush at SIGTERM", level=logging.DEBUG):
            publish_final(self.me)

    def at_exit(self) -> None:
        """Normal exit: let pending work finish (bounded), then leave this rank's exit copy."""
        with self.me.health.guard("flush at exit", level=logging.DEBUG):
            self.wait_idle(self.me.config.flush_timeout)
            publish_final(self.me)

    def stop(self, timeout: float) -> None:
        """End the worker thread (after the work already queued)."""
        if self._worker is not None:
            self._jobs.put(None)
            if self._worker is not threading.current_thread():
                self._worker.join(timeout)
            self._worker = None


def _describe(meta: dict[str, Any]) -> str:
    """An incident's owner record as a sentence for the log."""
    if "pg_name" in meta:
        return (f"{meta.get('op') or 'collective'} #{meta.get('seq')} on group {meta.get('pg_name')} "
                f"({meta.get('pg_desc', '')}) in flight {meta.get('age_s')} s (threshold {meta.get('threshold_s')} s)")
    return str(meta.get("reason", ""))
