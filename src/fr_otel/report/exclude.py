"""The hosts to leave out next time, and the scheduler commands that do it, on the terminal and the page.

The list is :func:`fr_otel.diagnosis.restart.hosts_to_exclude`'s; the commands are built (shell-quoted)
in :mod:`fr_otel.common.commands`. Nothing here runs them.
"""

from __future__ import annotations

from ..common.commands import exclude_command_lines
from ..diagnosis.restart import exclude_reason, hosts_to_exclude
from ..diagnosis.verdict import Verdict
from .markup import esc

__all__ = ["exclude_html", "exclude_lines"]


def exclude_lines(v: Verdict) -> list[str]:
    """``Leave out next time: node1`` and one indented line per command; none when nothing calls for it."""
    hosts = hosts_to_exclude(v)
    if not hosts:
        return []
    lines = ["", f"Leave out next time: {', '.join(hosts)} (commands for you to run; fr-otel runs none):"]
    lines += [f"  {who}: {command}" for who, command in exclude_command_lines(hosts, exclude_reason(v))]
    return lines


def exclude_html(v: Verdict) -> str:
    """The same as a card of the Verdict section (empty when nothing calls for it)."""
    hosts = hosts_to_exclude(v)
    if not hosts:
        return ""
    items = "".join(f"<li>{esc(who)}: <code>{esc(command, 600)}</code></li>"
                    for who, command in exclude_command_lines(hosts, exclude_reason(v)))
    return (f'<div class="card exclude"><p><b>Leave out next time</b>: {esc(", ".join(hosts), 600)} '
            f"(commands for you to run; fr-otel runs none)</p><ul>{items}</ul></div>")
