"""The page's Trace section: the incident's trace id, what became of its export, how to open it.

The words about the export are the export's own (``ExportOutcome.describe`` in
:mod:`fr_otel.incident.delivery`: the CLI, the watcher and the agent say the same), handed
down as plain data in a :class:`TraceDelivery`, so the page cannot tell a partly delivered or
spooled trace differently from the terminal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..common.export_status import ExportStatus
from ..common.text import printable
from .markup import esc

__all__ = ["TraceDelivery", "trace_section"]


@dataclass(frozen=True, slots=True)
class TraceDelivery:
    """The incident's trace as the page tells it (filled from the export's outcome by its caller)."""

    trace_id: str  # 32 hex digits
    status: ExportStatus | None = None  # None: the live incident's, its outcome not recorded
    where: str = ""  # the trace's file (written or spooled), else its endpoint
    sentence: str = ""  # the outcome in its own words ("sent to …", "only PARTLY delivered to …")
    replay: str = ""  # the fr-otel replay command that sends the file, when there is one

    @classmethod
    def recorded(cls, trace_id: str, summary: Mapping[str, Any]) -> TraceDelivery:
        """What became of a live incident's trace, as its export recorded it in ``incident.json``'s
        summary (untrusted: each value bounded and printable); an unreadable record says nothing."""
        export = summary.get("export")
        export = export if isinstance(export, dict) else {}

        def text(key: str, limit: int) -> str:
            value = export.get(key)
            return printable(value)[:limit] if isinstance(value, str) else ""

        status = text("status", 16)
        if status not in tuple(ExportStatus) or not text("sentence", 1):
            return cls(trace_id)
        return cls(trace_id, ExportStatus(status), text("where", 4096), text("sentence", 4096), text("replay", 4096))


def trace_section(trace: TraceDelivery | None) -> str:
    """The section: how to open the trace where it went, or why it is not there."""
    out = ['<section id="trace"><h2>Trace</h2>']
    if trace is None:
        out.append("<p>Not exported. <code>fr-otel export PATH --html FILE</code> sends the same incident as one "
                   "OpenTelemetry trace (a span per collective per rank, linked across ranks) and names it here.</p>")
        out.append("</section>")
        return "".join(out)
    tid = esc(trace.trace_id, 64)
    out.append(f'<p>Trace id <code class="tid">{tid}</code></p>')
    if trace.sentence:
        warn = ' class="warn"' if trace.status not in (ExportStatus.FILE, ExportStatus.SENT) else ""
        out.append(f"<p{warn}>The trace was {esc(trace.sentence, 1500)}.</p>")
    elif trace.status is None:
        out.append("<p>The live incident's trace (its id is in <code>incident.json</code> beside the dumps); "
                   "what became of its export is not recorded there.</p>")
    by_id = (f"<li><b>Grafana Tempo</b>: Explore → Tempo → TraceQL, paste <code>{tid}</code> (or query "
             "<code>{ span.fr_otel.verdict != nil }</code>).</li>"
             f"<li><b>Jaeger</b>: paste <code>{tid}</code> in the search box, or open "
             f"<code>JAEGER_URL/trace/{tid}</code>.</li>")
    if trace.status == ExportStatus.FILE:
        out.append("<ul><li><b>Jaeger</b>: Search → Upload → choose that file (OTLP JSON Lines).</li>"
                   f"<li><b>Tempo / any OTLP backend</b>: <code>{esc(trace.replay, 600)}</code>, then open the trace "
                   "by its id.</li></ul>")
    elif trace.status in (ExportStatus.SENT, ExportStatus.PARTIAL, None):
        out.append(f"<ul>{by_id}</ul>")
    if trace.status == ExportStatus.SPOOLED and trace.replay:
        out.append(f"<p>Send it when the collector is back: <code>{esc(trace.replay, 600)}</code></p>")
    out.append("</section>")
    return "".join(out)
