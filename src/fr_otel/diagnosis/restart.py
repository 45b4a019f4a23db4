"""Whether a verdict calls for ending the job now, and which hosts a restart should leave out.

Ending a hung job early (``FR_OTEL_ON_HANG=abort``) trades the watchdog's 10-30 idle minutes for a
restart from the last checkpoint; it is only worth it, and only safe, when the verdict says work is
stuck and names where: a hang or desync with culprits, or a host lost. Never a straggler, a healthy
or inconclusive job, nor an incident raised as the job was ending anyway. The same verdicts name the
hosts to leave out next time (the culprits' hosts and the lost ones): the one list behind
``exclude-hosts.txt``, the trace root's ``fr_otel.exclude_hosts``, the metric and the commands.
"""

from __future__ import annotations

from ..common.names import host_name
from ..common.ranks import compress_ranks
from .hosts import LOST_STATES
from .kinds import VerdictWord
from .verdict import Verdict

__all__ = ["calls_for_restart", "exclude_reason", "hosts_to_exclude"]


def calls_for_restart(verdict: Verdict) -> bool:
    """Work is stuck (a hang, or a desync with a collective still in flight: a mismatch gloo let complete
    is a bug to fix, not a job to restart), the verdict says where (a culprit or a lost host), and the job
    was not ending anyway."""
    if not verdict.verdict.stuck or verdict.job_ended:
        return False
    if verdict.verdict == VerdictWord.DESYNC and not any(g.in_flight is not None for g in verdict.groups):
        return False
    return bool(verdict.blamed) or any(h.state in LOST_STATES for h in verdict.hosts)


def hosts_to_exclude(verdict: Verdict) -> tuple[str, ...]:
    """The hosts a restart should leave out, in the verdict's order: the lost hosts, then the culprits'
    hosts, each by the scheduler's node name where the job knew it (Slurm's, which ``--exclude`` takes);
    none unless :func:`calls_for_restart` (a straggler's host is slow, not broken)."""
    if not calls_for_restart(verdict):
        return ()
    node = {c.rank: c.process.place for c in verdict.culprits if c.process is not None and c.process.place}
    blamed = {c.rank for c in verdict.blamed}
    hosts = [next((node[r] for r in h.ranks if r in node), h.host) for h in verdict.hosts if h.state in LOST_STATES]
    hosts += [next((node[r] for r in h.blamed if r in node), h.host) for h in verdict.hosts if set(h.blamed) & blamed]
    hosts += [node.get(c.rank) or c.host or "" for c in verdict.blamed]
    return tuple(dict.fromkeys(h for h in hosts if host_name(h)))  # what a scheduler command may name


def exclude_reason(verdict: Verdict) -> str:
    """Why the hosts are left out, short enough for a drain reason: ``fr-otel hang: culprit rank(s) 2``."""
    why = [f"{h.host} {LOST_STATES[h.state]}" for h in verdict.hosts if h.state in LOST_STATES][:2]
    if verdict.blamed:
        why.append(f"culprit rank(s) {compress_ranks(c.rank for c in verdict.blamed)}")
    return f"fr-otel {verdict.verdict}: {', '.join(why)}"
