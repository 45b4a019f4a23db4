"""The coordinator's part: gather every rank's recorder, run the incident pipeline once, say the verdict.

The raiser (through the store: :mod:`.gather`), or a node's first rank when the store is lost (:mod:`.local`),
hands the evidence to the incident pipeline (:mod:`fr_otel.incident.pipeline`) for one verdict and one trace:
the verdict as root, each rank's spans under its own resource, one span per collective that every rank's entry
links to. One process builds and exports every span, so each arrives exactly once and every link resolves; a
collector that is down leaves a spool file (``fr-otel replay``). The pipeline writes the files beside the dumps
(only into a folder that is really this incident's); this module says the verdict in one log line and returns
its summary, its lists cut for the store (:func:`fr_otel.incident.summary.brief_summary`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from ...common.files import own_folder
from ...common.gc_pause import gc_paused
from ...common.log import logger
from ...common.ranks import compress_ranks
from ...incident.sinks import sink_for
from ...incident.summary import brief_summary
from ...incident.trigger import Trigger
from ...read.reader import ReadResult
from ..observe.proc_state import recount_ooms
from ...trace.options import TraceOptions
from .gather import Gathered, complete_from_nodes, gather
from .rank import IncidentRank, dump_path

if TYPE_CHECKING:
    from ...diagnosis.verdict import Culprit

__all__ = ["CONCLUDE_RESERVE_S", "conclude", "coordinate"]

log = logger("fr_otel.agent")

#: What a local verdict needs after the store is found gone: its own node's gathering and the pipeline.
CONCLUDE_RESERVE_S = 3.0


def coordinate(me: IncidentRank, trigger: Trigger, trace_hex: str, deadline: float, *,
               dump_written: bool = True) -> tuple[Gathered, dict[str, Any]]:
    """The coordinator's gathering and verdict for the incident (returns what was gathered and the
    verdict's summary), with the cyclic GC paused throughout: at 16k ranks it rescans the growing heap
    of decoded recorders again and again (40 % of the decoding's CPU, a third of the analysis'). The
    pause is bounded by the incident's deadline, and only cyclic garbage waits for it (reference
    counting frees the rest). A slow host's ranks are waited for however late their heartbeats."""
    k = trigger.number
    with gc_paused():
        gathered = gather(me, k, deadline, trigger.slow_ranks)
        result = conclude(me, trigger, gathered.evidence, trace_hex, deadline, dump_written=dump_written,
                          complete=partial(complete_from_nodes, me, k, gathered, deadline))
    return gathered, result


def conclude(me: IncidentRank, trigger: Trigger, evidence: ReadResult, trace_hex: str, deadline: float,
             *, dump_written: bool = True, local: bool = False,
             complete: Callable[..., bool] | None = None) -> dict[str, Any]:
    """The incident pipeline over the gathered evidence: verdict, trace, files beside the dumps, one
    log line; returns the verdict's summary (what the store's result key holds). ``local``: this node's
    own part, the store lost (this rank concludes it, whoever raised it)."""
    # The analysis loads only when an incident happens.
    from ...diagnosis.hosts import LOST_STATES
    from ...diagnosis.restart import hosts_to_exclude
    from ...incident.pipeline import IncidentPlan, run_incident
    from ...report.action import action_sentence

    k = trigger.number
    if local:
        trigger = replace(trigger, raised_by=me.rank)
    folder = dump_path(me, trace_hex).parent
    mine = False  # files beside the dumps: only into a folder that is really ours
    with me.health.guard("checking the incident's folder"):
        own_folder(folder)
        mine = True
    remaining = max(deadline - time.monotonic(), 1.0)
    options = TraceOptions(job_id=me.job_id, incident=str(k),
                           root_attributes=trigger.root_attributes(local_to=(me.process.host or "") if local else None),
                           root_key=f"local/{me.process.host}" if local else "")
    plan = IncidentPlan(trace=options, sink=sink_for(me.export_config, me.config.out_dir),
                        files_to=folder if mine else None, deadline_s=min(remaining, me.export_config.timeout_s),
                        complete=partial(complete, options=options) if complete is not None else None, trigger=trigger)
    with me.health.guard("recounting OOM kills"):
        _recount_ooms(me, evidence)
    result = run_incident(evidence, plan)
    trace, outcome, verdict, summary = result.trace, result.outcome, result.verdict, result.summary
    assert trace is not None and outcome is not None and summary is not None
    if not outcome.ok:
        me.health.export_failed()
    if result.files_error:
        log.warning("incident %d: %s", k, result.files_error)
    culprits = ", ".join(_brief(c) for c in verdict.culprits[:8]) or "none named"
    gone = [h.sentence() for h in verdict.hosts if h.state in LOST_STATES]
    if gone:
        culprits = f"{'; '.join(gone[:4])}; {culprits}"
    if verdict.stop_order is not None and verdict.stop_order.sentence():
        culprits += f" ({verdict.stop_order.sentence()})"
    away = [f"{h.host} (ranks {compress_ranks(h.missing)})" for h in verdict.hosts if h.state == "unreachable"]
    if away:
        culprits += f"; unreachable from here, not culprits: {', '.join(away[:6])}"
    exclude = hosts_to_exclude(verdict)
    action = action_sentence(verdict)
    if action:  # a verdict that calls for ending the job supersedes the last one's hosts (none: a code fault's)
        me.health.exclude(k, exclude)
        culprits += f"; what to do: {action}"
    if exclude:
        culprits += " (exclude-hosts.txt)"
    where = outcome.describe(len(trace.spans), me.export_config)
    dumps = f"dumps and report in {folder}" if dump_written else f"no dump files: {folder} could not be written"
    scope = f"local to {me.process.host}, " if local else ""
    log.warning("incident %d (%s%s, raised by rank %s): %s; culprits: %s; %d of %d ranks' recorders; trace %s %s; %s",
                k, scope, trigger.words, trigger.raised_by, verdict.verdict, culprits,
                len(evidence.dumps), me.world_size, trace_hex, where, dumps)
    return brief_summary(summary)


def _recount_ooms(me: IncidentRank, evidence: ReadResult) -> None:
    """The OOM-kill counters of this host's gone ranks read again as the incident concludes (a kill that landed
    during the incident counts); only what a rank of this host read, which this host's counters speak for."""
    host = me.process.host
    mates = {r for r, p in me.hosts.processes.items() if p.host == host and host} | {me.rank}
    for dump in evidence.dumps.values():
        for rank, facts in list(dump.host_view.items()):
            if facts.gone and facts.seen_by in mates:
                dump.host_view[rank] = recount_ooms(facts, me.oom_baseline)


def _brief(c: Culprit) -> str:
    """``rank 2 (not_enqueued, host vm, step 20) at vm:4242 in time.sleep at train.py:27 in main``; a rank
    that counted no step of its own (no dump: lost, frozen) gets the step of the collective it is blamed in."""
    step = c.step if c.step is not None else c.collective_step
    parts = [c.kind] + ([f"host {c.host}"] if c.host else []) + ([f"step {step}"] if step is not None else [])
    text = f"rank {c.rank} ({', '.join(parts)})"
    if c.process is not None and c.process.known:
        text += f" at {c.process.address}"
    if c.now is not None and c.now.where is not None:
        text += f" {c.now.describe()}"
    if c.cause is not None:
        text += f"; cause: {c.cause.cls} [{c.cause.domain}]" + (f" ({c.cause.evidence[0]})" if c.cause.evidence else "")
    return text
