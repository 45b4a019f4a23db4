"""An incident's verdict in short: what ``incident.json`` keeps and the job's store holds for its ranks.

One shape, built here once per incident: the verdict word, its culprits (who, where, which step, where each is
now), which rank stopped first, the hosts, the hosts to leave out and whether the verdict calls for a restart,
and what became of the trace. ``fr-otel demo`` prints it as the live verdict; the page's Trace section reads its
``export``; the store holds it with shorter lists (:func:`brief_summary`), where an aborting rank reads its
``hang``, ``action``, ``culprits`` and ``exclude_hosts`` (a rank whose node leader answers learns only ``hang``
and ``action``, from the leader's board). ``fr-otel analyze --json`` is the whole verdict (the public schema), of which this is the
short form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..diagnosis.restart import calls_for_restart, hosts_to_exclude, verdict_action

if TYPE_CHECKING:
    from ..diagnosis.verdict import Culprit, Verdict
    from ..otlp.config import ExportConfig
    from ..trace.spans import IncidentTrace
    from .delivery import ExportOutcome

__all__ = ["MAX_LISTED", "STORE_LISTED", "brief_summary", "verdict_summary"]

#: Culprits and hosts listed at most (the rest are in the dumps and the trace).
MAX_LISTED = 64
#: Culprits and hosts the store's copy lists (every rank may read it: it stays a few KB at 100k ranks).
STORE_LISTED = 16
#: What of a culprit the store's copy keeps.
_BRIEF_CULPRIT = ("rank", "kind", "host", "step", "collective_step")


def verdict_summary(verdict: Verdict, trace: IncidentTrace, outcome: ExportOutcome,
                    config: ExportConfig) -> dict[str, Any]:
    """The incident's verdict in short (JSON), with its trace id and what became of the trace's export."""
    page = outcome.for_page(trace.trace_id_hex, len(trace.spans), config)
    order = verdict.stop_order
    return {
        "verdict": verdict.verdict,
        "culprits": [_culprit_summary(c, verdict.steps) for c in verdict.culprits[:MAX_LISTED]],
        "first_stopped": order.first if order is not None else None,
        "stop_order": (order.sentence() or None) if order is not None else None,
        "hosts": [h.to_dict() for h in verdict.hosts[:MAX_LISTED]],
        "exclude_hosts": list(hosts_to_exclude(verdict)),
        "hang": calls_for_restart(verdict),
        "action": verdict_action(verdict),
        "trace_id": trace.trace_id_hex,
        "export": {"status": outcome.status, "destination": outcome.destination, "where": page.where,
                   "sentence": page.sentence, "replay": page.replay,
                   "spans_rejected": outcome.result.spans_rejected if outcome.result else 0},
        "spans": len(trace.spans),
    }


def _culprit_summary(c: Culprit, steps: dict[int, int]) -> dict[str, Any]:
    """What a person asks first of a culprit (who, on which host, in which step, where it is now),
    readable in ``incident.json`` without the dumps: ``fr-otel demo`` prints it as the live verdict."""
    from ..report.text import step_sentence

    known = c.step is not None or c.collective_step is not None
    return {"rank": c.rank, "kind": c.kind, "evidence": c.evidence, "host": c.host, "step": c.step,
            "collective_step": c.collective_step, "steps": step_sentence(c, steps) if known else None,
            "cause": c.cause.to_dict() if c.cause is not None else None, "record": c.record_dict(),
            **(c.now_dict() or {})}


def brief_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The same summary, its lists cut for the job's store (every rank reads it): at most
    :data:`STORE_LISTED` culprits (who, what, where, which step: no stacks or evidence) and hosts."""
    brief = dict(summary)
    brief["culprits"] = [{k: c.get(k) for k in _BRIEF_CULPRIT} for c in summary.get("culprits", [])[:STORE_LISTED]]
    brief["hosts"] = list(summary.get("hosts", [])[:STORE_LISTED])
    return brief
