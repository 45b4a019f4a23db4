"""Opt-in (``FR_OTEL_ON_HANG=abort``): end a hung job in minutes, not at the watchdog.

A hang otherwise idles every GPU of the job until the NCCL watchdog fires (10-30 min), and only then
does the launcher restart it. With ``abort``, once an incident this rank took part in has a verdict that
calls for ending the job (:func:`fr_otel.diagnosis.restart.calls_for_restart`: a hang or desync naming culprits
or a lost host, never a straggler, a healthy or inconclusive job, nor an incident raised as the job was
ending) and this rank's part of it is over (its dump written; on the coordinator the trace delivered and
the files written, or their budgets spent), the rank is **armed**. It **fires on its own evidence** only:
a collective it had in flight when it took part is still in flight, the same one, and has been for at
least ``abort_after_s`` by its own recorder. A verdict read from the store, which anything that reaches
the store's port can write, ends nothing by itself: a rank whose collectives move on is not stuck.

Ranks in no collective (often the culprit itself) do not exit on their own: torchrun ends a node's
other workers once one fails, and the peers' leaving fails any collective they enter later.

The exit is ``os._exit(code)`` from the agent's thread: the training thread sits in a collective inside
C++, where neither an exception nor a signal handler reaches it, and everything the incident owed is done.
The code tells the scheduler what to do (:data:`fr_otel.diagnosis.restart.EXIT_CODES`): 70 (EX_SOFTWARE) when
the verdict's action is to fix the code (a retry hangs again), else 75 (EX_TEMPFAIL: restart, elsewhere or in
place). The log line says what it did and why. torchrun exits 1 for any failed worker (its summary shows
``exitcode: 70`` or ``75``); under ``fr-otel run --on-hang abort`` the rank also appends its number and code to
``FR_OTEL_ABORT_MARK``'s file, and ``fr-otel run`` exits with that code itself.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..common.commands import exclude_command_lines
from ..common.log import logger
from ..common.names import host_name
from ..common.json_types import is_exact_int
from ..common.text import one_line
from ..diagnosis.restart import EXIT_CODES, Action
from ..diagnosis.verdict import NOT_BLAMED
from ..incident.trigger import Trigger
from .config import FR_OTEL_ABORT_MARK
from .observe.state import GroupStatus

__all__ = ["ABORT_EXIT_CODE", "CODE_FAULT_EXIT_CODE", "HangAbort", "attempt_number", "mark_attempt", "stuck_collectives"]

#: sysexits' EX_TEMPFAIL, "a temporary failure; the caller is invited to retry": what torchrun's
#: ``--max-restarts``, a Slurm resubmission (deploy/slurm/fr-otel.sbatch) and a Kubernetes Job's
#: ``podFailurePolicy`` act on; the code of a hang whose action is a restart (elsewhere or in place).
ABORT_EXIT_CODE = EXIT_CODES[Action.RESTART_IN_PLACE]
#: sysexits' EX_SOFTWARE, "do not retry blindly": the code of a hang whose action is to fix the code.
CODE_FAULT_EXIT_CODE = EXIT_CODES[Action.FIX_CODE]
#: How long the exit waits, at most, for this node's copy of the incident's files (fetched on a thread).
FILES_WAIT_S = 10.0
_MAX_HOSTS = 64

log = logger("fr_otel.agent")


def attempt_number() -> int:
    """Which attempt of the job this process belongs to (torchelastic's restart count; 0 without it)."""
    raw = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0").strip()
    return int(raw) if raw.isdigit() else 0


def mark_attempt(line: str) -> None:
    """One line (``start N`` when a rank of attempt N starts, ``abort N RANK CODE`` when it ends a hang) in the file
    ``fr-otel run --on-hang abort`` reads after COMMAND: it exits 70 or 75 only when the last attempt ended a hang,
    not for a later attempt's own failure. Nothing without that file; a failure to write is a log line."""
    mark = os.environ.get(FR_OTEL_ABORT_MARK, "")
    if not mark:
        return
    try:
        with open(mark, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as exc:
        log.warning("cannot tell fr-otel run about this attempt in %s: %s", mark, exc.strerror or exc)


def stuck_collectives(statuses: Iterable[GroupStatus], trigger: Trigger | None = None) -> frozenset[tuple[str, int]]:
    """What an armed abort watches: this rank's collectives in flight now, by group and sequence number, and
    the incident's own stall (``trigger``'s: a rank that enters that collective only after it took part is
    stuck in the hang all the same)."""
    keys = {(g.name, g.inflight_seq) for g in statuses if g.inflight_seq is not None}
    stall = trigger.stall if trigger is not None else None
    if stall is not None and stall.seq is not None:
        keys.add((stall.pg_name, stall.seq))
    return frozenset(keys)


@dataclass(frozen=True, slots=True)
class _Armed:
    incident: int
    stuck: frozenset[tuple[str, int]]
    culprits: str
    exclude_hosts: tuple[str, ...]
    reason: str
    code: int  # the exit code: 70 for a code fault, else 75
    before_exit: tuple[threading.Thread, ...]
    not_before: float  # monotonic: the grace after arming (see HangAbort.grace_s)


class HangAbort:
    """This rank's armed incidents, and the check each poll makes of them."""

    def __init__(self, rank: int, abort_after_s: float, *, grace_s: float = 0.0,
                 end: Callable[[int], Any] = os._exit) -> None:
        self.rank = rank
        self.abort_after_s = abort_after_s
        #: How long an armed rank waits before it may end: the others read the verdict and fetch the files
        #: in their next polls, and the store may live in this very process (rank 0, with torchrun's
        #: store not shared): gone too early, it would send them to a verdict of their own without it.
        self.grace_s = grace_s
        self._end = end
        self._lock = threading.Lock()
        self._armed: list[_Armed] = []

    def arm(self, k: int, summary: Mapping[str, Any] | None, stuck: frozenset[tuple[str, int]],
            before_exit: tuple[threading.Thread, ...] = ()) -> bool:
        """Incident ``k`` ended for this rank with verdict ``summary`` (the store's :func:`fr_otel.incident.summary.brief_summary`, or a board's ``verdict`` and ``hang``; None:
        unknown here); ``stuck``: the collectives this rank watches (those it had in flight when it took part,
        and the incident's own stall). True when armed."""
        if not isinstance(summary, Mapping) or summary.get("hang") is not True:
            return False
        if not stuck:
            log.info("incident %d calls for a restart, but rank %d was in no collective when it took part: it "
                     "does not end itself (its launcher ends it once a peer has)", k, self.rank)
            return False
        hosts = summary.get("exclude_hosts")
        hosts = tuple(h for h in hosts[:_MAX_HOSTS] if host_name(h)) if isinstance(hosts, list) else ()
        listed = summary.get("culprits")  # the summary's culprits (fr_otel.incident.summary), those blamed
        ranks = [c.get("rank") for c in listed if isinstance(c, dict) and isinstance(c.get("kind"), str)
                 and c["kind"] not in NOT_BLAMED] \
            if isinstance(listed, list) else []
        culprits = ",".join(str(r) for r in ranks[:16] if is_exact_int(r))
        reason = one_line(str(summary.get("verdict", "hang")), 40)
        # A code fault's hosts are healthy: whatever a summary lists, none is left out then.
        fix = summary.get("action") == Action.FIX_CODE
        code = CODE_FAULT_EXIT_CODE if fix else ABORT_EXIT_CODE
        with self._lock:
            self._armed.append(_Armed(k, stuck, culprits, () if fix else hosts, reason, code, before_exit,
                                      time.monotonic() + self.grace_s))
        log.info("incident %d: rank %d ends itself (FR_OTEL_ON_HANG=abort) if its collective of the hang is still "
                 "in flight %.0f s after it began", k, self.rank, self.abort_after_s)
        return True

    def check(self, statuses: Iterable[GroupStatus], now_ns: int | None = None) -> None:
        """End this process when an armed incident's collective is still in flight, at least the abort age old."""
        with self._lock:
            armed = list(self._armed)
        if not armed:
            return
        now_ns = time.time_ns() if now_ns is None else now_ns
        for g in statuses:
            if g.inflight_seq is None or g.age_s(now_ns) < self.abort_after_s:
                continue
            for a in armed:
                if (g.name, g.inflight_seq) in a.stuck and time.monotonic() >= a.not_before:
                    self._abort(a, g, g.age_s(now_ns))
                    return

    def _abort(self, a: _Armed, g: GroupStatus, age_s: float) -> None:
        exclude = ""
        if a.exclude_hosts:
            commands = "; ".join(c for _, c in exclude_command_lines(a.exclude_hosts, f"fr-otel incident {a.incident}"))
            exclude = f"; leave out next time: {', '.join(a.exclude_hosts)} ({commands})"
        fix = a.code == CODE_FAULT_EXIT_CODE
        then = ("the culprit stopped in its own code: fix it, a restart would hang again" if fix
                else "the launcher can restart the job now instead of at the watchdog")
        log.error("rank %d ends its process with exit code %d (FR_OTEL_ON_HANG=abort): incident %d's verdict is a %s "
                  "(culprit rank(s) %s) and this rank's %s #%s on group %s has been in flight %.0f s (>= %.0f s): "
                  "%s%s", self.rank, a.code, a.incident, a.reason, a.culprits or "in its incident.json",
                  g.op or "collective", g.inflight_seq, g.name, age_s, self.abort_after_s, then, exclude)
        deadline = time.monotonic() + FILES_WAIT_S
        for thread in a.before_exit:  # this node's copy of the incident's files, fetched on a thread
            thread.join(max(deadline - time.monotonic(), 0.0))
        mark_attempt(f"abort {attempt_number()} {self.rank} {a.code}")  # fr-otel run then exits so, not torchrun's 1
        for handler in log.handlers:
            handler.flush()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        self._end(a.code)
