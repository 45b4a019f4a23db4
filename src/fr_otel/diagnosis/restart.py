"""What a verdict calls for doing with the job: end it now or not, and then fix the code, restart elsewhere, or
restart in place; the hosts to leave out; the exit code that tells the scheduler which.

Ending a hung job early (``FR_OTEL_ON_HANG=abort``) trades the watchdog's 10-30 idle minutes for a
restart from the last checkpoint; it is only worth it, and only safe, when the verdict says work is
stuck and names where: a hang or desync with culprits, or a host lost. Never a straggler, a healthy
or inconclusive job, nor an incident raised as the job was ending anyway.

What follows depends on *why* the culprits stopped (each cause's failure domain, :mod:`.cause_kinds`), never
on the hang alone: most hangs are the job's own code, and a host is left out only on evidence against it.

- **restart elsewhere** (evidence against a host: a lost, cut-off or frozen host, the store's host gone, a
  device fault, a slow host, the kernel killing a rank): the hosts to leave out are those hosts, the one list
  behind ``exclude-hosts.txt``, the trace root's ``fr_otel.exclude_hosts``, ``fr_exclude_host`` and the
  scheduler commands; exit 75 (EX_TEMPFAIL: a retry can help);
- **fix the code** (every culprit's cause is the rank's own code or process: a data-loader stall, a busy
  loop, a deadlock, a desync, an exception): no host is left out, exit 70 (EX_SOFTWARE: a retry hangs again);
- **restart in place** (no evidence either way: a rank killed by a signal with no OOM record, a dump with no
  agent beside it): no host is left out, exit 75.

Evidence against a host wins over evidence against the code (a lost host makes its peers' code fail too), and
evidence of either wins over none.
"""

from __future__ import annotations

from ..common.names import host_name
from ..common.ranks import compress_ranks
from ..common.str_enum import StrEnum
from .cause_kinds import Domain
from .hosts import LOST_STATES
from .kinds import VerdictWord
from .verdict import Culprit, Verdict

__all__ = ["EXIT_CODES", "Action", "calls_for_restart", "culprit_domain", "exclude_reason", "hosts_to_exclude",
           "verdict_action"]


class Action(StrEnum):
    """What a verdict that calls for ending the job asks of people and the scheduler (JSON ``action``)."""

    FIX_CODE = "fix_code"
    RESTART_ELSEWHERE = "restart_elsewhere"
    RESTART_IN_PLACE = "restart_in_place"


#: The exit code an ended job leaves for its scheduler (sysexits.h): 70 EX_SOFTWARE, "do not retry blindly";
#: 75 EX_TEMPFAIL, "a temporary failure; retry". ``deploy/slurm/fr-otel.sbatch`` and the Kubernetes example's
#: ``podFailurePolicy`` act on it (torchrun's ``--max-restarts`` restarts on any failure).
EXIT_CODES: dict[Action, int] = {Action.FIX_CODE: 70, Action.RESTART_ELSEWHERE: 75, Action.RESTART_IN_PLACE: 75}


def calls_for_restart(verdict: Verdict) -> bool:
    """Work is stuck (a hang, or a desync with a collective still in flight: a mismatch gloo let complete
    is a bug to fix, not a job to end), the verdict says where (a culprit or a lost host), and the job
    was not ending anyway."""
    if not verdict.verdict.stuck or verdict.job_ended:
        return False
    if verdict.verdict == VerdictWord.DESYNC and not any(g.in_flight is not None for g in verdict.groups):
        return False
    return bool(verdict.blamed) or any(h.state in LOST_STATES for h in verdict.hosts)


def culprit_domain(c: Culprit) -> Domain:
    """Whose fault culprit ``c`` is, by its cause (``unknown`` without one)."""
    return c.cause.domain if c.cause is not None else Domain.UNKNOWN


def verdict_action(verdict: Verdict) -> Action | None:
    """What to do with the job (None: nothing calls for ending it, see :func:`calls_for_restart`)."""
    if not calls_for_restart(verdict):
        return None
    domains = {culprit_domain(c) for c in verdict.blamed}
    if Domain.INFRASTRUCTURE in domains or any(h.state in LOST_STATES for h in verdict.hosts):
        return Action.RESTART_ELSEWHERE
    if Domain.SOFTWARE in domains:
        return Action.FIX_CODE
    return Action.RESTART_IN_PLACE


def hosts_to_exclude(verdict: Verdict) -> tuple[str, ...]:
    """The hosts a restart should leave out, in the verdict's order: the lost hosts, then the hosts of the
    culprits whose cause is evidence against their machine, each by the scheduler's node name where the job
    knew it (Slurm's, which ``--exclude`` takes); none unless the action is to restart elsewhere (a code
    fault's host is healthy, a straggler's is slow, not broken)."""
    if verdict_action(verdict) != Action.RESTART_ELSEWHERE:
        return ()
    node = {c.rank: c.process.place for c in verdict.culprits if c.process is not None and c.process.place}
    against = {c.rank for c in verdict.blamed if culprit_domain(c) == Domain.INFRASTRUCTURE}
    hosts = [next((node[r] for r in h.ranks if r in node), h.host) for h in verdict.hosts if h.state in LOST_STATES]
    hosts += [next((node[r] for r in h.blamed if r in node), h.host) for h in verdict.hosts if set(h.blamed) & against]
    hosts += [node.get(c.rank) or c.host or "" for c in verdict.blamed if c.rank in against]
    return tuple(dict.fromkeys(h for h in hosts if host_name(h)))  # what a scheduler command may name


def exclude_reason(verdict: Verdict) -> str:
    """Why the hosts are left out, short enough for a drain reason: ``fr-otel hang: node1 lost``."""
    why = [f"{h.host} {LOST_STATES[h.state]}" for h in verdict.hosts if h.state in LOST_STATES][:2]
    against = [c.rank for c in verdict.blamed if culprit_domain(c) == Domain.INFRASTRUCTURE]
    if against:
        why.append(f"culprit rank(s) {compress_ranks(against)}")
    return f"fr-otel {verdict.verdict}: {', '.join(why)}"
