"""What to do with the job, on the terminal and the page: fix the code (where), restart elsewhere (the hosts
to leave out, with the scheduler commands that do it), or restart in place (no evidence either way).

The action is :func:`fr_otel.diagnosis.restart.verdict_action`'s, from the culprits' failure domains; the host
list is :func:`~fr_otel.diagnosis.restart.hosts_to_exclude`'s; the commands are built (shell-quoted) in
:mod:`fr_otel.common.commands`. Nothing here runs them. A drain, cordon or ``--exclude`` is only ever shown for
evidence against a host: a code fault's host is healthy, and restarting elsewhere would hang again.
"""

from __future__ import annotations

from ..common.commands import exclude_command_lines
from ..common.ranks import compress_ranks
from ..diagnosis.cause_kinds import Domain
from ..diagnosis.restart import EXIT_CODES, Action, culprit_domain, exclude_reason, hosts_to_exclude, verdict_action
from ..diagnosis.verdict import Culprit, Verdict
from .markup import esc

__all__ = ["ACTION_WORDS", "DOMAIN_WORDS", "action_html", "action_lines", "action_sentence", "call_site"]

_MAX_SITES = 4

#: Each action in a few words, where only its name is known (a recorded summary: ``fr-otel demo``).
ACTION_WORDS = {Action.FIX_CODE: "fix the code: the culprit stopped in its own code, a restart would hang again, "
                                 "and no host is left out",
                Action.RESTART_ELSEWHERE: "restart elsewhere, leaving out the hosts with evidence against them",
                Action.RESTART_IN_PLACE: "restart in place: nothing says whether the code or a host is at fault"}

#: A cause's failure domain as the page says it beside the cause.
DOMAIN_WORDS = {Domain.SOFTWARE: "software: its own code or process",
                Domain.INFRASTRUCTURE: "infrastructure: evidence against its host",
                Domain.UNKNOWN: "unknown: no evidence whose fault"}


def call_site(c: Culprit) -> str:
    """Where culprit ``c``'s code was: its live frame, else its last recorded call site (``""``: unknown)."""
    f = c.now.where if c.now is not None else None
    if f is not None:
        return f"{f.filename}:{f.line} in {f.name}"
    last = c.last_frame
    return f"{last.filename}:{last.line} in {last.name}" if last is not None else ""


def action_sentence(v: Verdict) -> str:
    """The action in one sentence (the log line, the trace root), ``""`` when nothing calls for one."""
    action = verdict_action(v)
    if action is None:
        return ""
    code = EXIT_CODES[action]
    if action == Action.FIX_CODE:
        ranks = compress_ranks(c.rank for c in v.blamed if culprit_domain(c) == Domain.SOFTWARE)
        return (f"fix the code: rank(s) {ranks} stopped in their own code (software), so a restart hangs again and "
                f"no host is to blame (with --on-hang abort: exit {code}, do not retry)")
    if action == Action.RESTART_ELSEWHERE:
        hosts = hosts_to_exclude(v)
        against = compress_ranks(c.rank for c in v.blamed if culprit_domain(c) == Domain.INFRASTRUCTURE)
        out = (f"leaving out {', '.join(hosts)}" if hosts else
               f"leaving out the host(s) of rank(s) {against or '?'} (not named in these files: a ranks.json beside "
               "the dumps names them)")
        return (f"restart elsewhere, {out} (evidence against the host: {exclude_reason(v).split(': ', 1)[-1]}; "
                f"with --on-hang abort: exit {code}, retry)")
    unknown = compress_ranks(c.rank for c in v.blamed if culprit_domain(c) == Domain.UNKNOWN)
    return (f"restart in place: nothing says whether rank(s) {unknown or '?'} stopped for their code or their host, "
            f"so no host is left out (with --on-hang abort: exit {code}, retry)")


def _sites(v: Verdict) -> list[str]:
    """Where each culprit in its own code was (the ones whose cause is software)."""
    return [f"rank {c.rank}: {site}" for c in v.blamed if culprit_domain(c) == Domain.SOFTWARE
            and (site := call_site(c))][:_MAX_SITES]


def _missing(v: Verdict) -> list[str]:
    """For a restart in place: what each culprit's evidence lacked, and how to have it next time."""
    out = []
    for c in v.blamed[:_MAX_SITES]:
        if culprit_domain(c) == Domain.UNKNOWN and c.cause is not None:
            out.append(f"rank {c.rank} ({c.cause.cls}): {c.cause.info.next_step}")
    return out


def action_lines(v: Verdict) -> list[str]:
    """``What to do: ...`` and its details (call sites, hosts with commands, evidence to collect); none when
    nothing calls for ending the job."""
    action = verdict_action(v)
    if action is None:
        return []
    lines = ["", f"What to do: {action_sentence(v)}."]
    if action == Action.FIX_CODE:
        lines += [f"  {s}" for s in _sites(v)]
    elif action == Action.RESTART_ELSEWHERE and hosts_to_exclude(v):
        lines.append("  Leave out next time (commands for you to run; fr-otel runs none):")
        lines += [f"  {who}: {command}" for who, command in exclude_command_lines(hosts_to_exclude(v),
                                                                                 exclude_reason(v))]
    else:
        lines += [f"  {m}" for m in _missing(v)]
    return lines


def action_html(v: Verdict) -> str:
    """The same as a card of the Verdict section (empty when nothing calls for it)."""
    action = verdict_action(v)
    if action is None:
        return ""
    if action == Action.RESTART_ELSEWHERE:
        hosts = hosts_to_exclude(v)
        items = [f"{esc(who)}: <code>{esc(command, 600)}</code>"
                 for who, command in exclude_command_lines(hosts, exclude_reason(v))]
        head = (f"<b>Leave out next time</b>: {esc(', '.join(hosts), 600)} "
                "(commands for you to run; fr-otel runs none)") if hosts else ""
    else:
        items = [esc(s, 400) for s in (_sites(v) if action == Action.FIX_CODE else _missing(v))]
        head = ""
    listed = "".join(f"<li>{item}</li>" for item in items)
    return (f'<div class="card action {esc(str(action))}"><p><b>What to do</b>: {esc(action_sentence(v), 800)}.</p>'
            + (f"<p>{head}</p>" if head else "") + (f"<ul>{listed}</ul>" if listed else "") + "</div>")
