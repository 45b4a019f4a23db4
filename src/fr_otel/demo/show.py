"""What the demo prints, in the order a person on call needs it.

1. the live verdict, as the agent wrote it beside the dumps (``incident.json``): the culprit, its
   host, the training step, who stopped first, where it is now (its live frame);
2. the culprit as the ranks' ``/metrics`` show it, with the PromQL that finds it in Prometheus;
3. where the trace went and how to open it; 4. the HTML report; 5. how to re-analyse offline.

Everything read from the incident's files is untrusted text: it is printed through ``printable``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ..common.clock import format_clock
from ..common.promql import BLAME_RULE, culprit_query
from ..common.ranks import compress_ranks
from ..common.text import printable
from ..incident.files import REPORT_FILE
from ..incident.trigger import SeenStall, Trigger
from ..read.incident_file import IncidentIdentity
from ..read.rank_map import RANKS_FILE, read_host_map
from ..diagnosis.cause_kinds import cause_from_json
from ..diagnosis.restart import Action
from ..report.action import ACTION_WORDS
from .job import DemoPlan
from .scrape import Scrape

__all__ = ["Findings", "intro", "render"]

MAX_FRAMES = 8


class Findings:
    """What the demo found, checked against what it planted (the stall's rank and step)."""

    def __init__(self, plan: DemoPlan, identity: IncidentIdentity, scraped: Scrape) -> None:
        self.plan, self.identity, self.scraped = plan, identity, scraped
        culprits = identity.summary.get("culprits")
        self.culprits: list[dict[str, Any]] = [c for c in culprits if isinstance(c, dict)] if isinstance(
            culprits, list) else []
        self.first: dict[str, Any] = self.culprits[0] if self.culprits else {}
        ranks_file = Path(identity.path).parent / RANKS_FILE  # where each rank ran: ranks.json's, beside it
        host_map = read_host_map(str(ranks_file), []) if identity.path and ranks_file.is_file() else None
        self.processes = host_map.processes if host_map is not None else {}
        self.blame = scraped.blame(plan.stall_seconds)
        self.metrics_culprits = sorted({r for g in self.blame for r in g.culprits})

    def problems(self) -> list[str]:
        """Where the demo fell short of what it planted (empty: everything named rank and step right)."""
        want = self.plan.stall_rank
        out = []
        if self.first.get("rank") != want:
            out.append(f"the live verdict names {self._ranks()} instead of rank {want}")
        elif self.first.get("step") != self.plan.stall_step:
            out.append(f"the live verdict puts rank {want} in step {self.first.get('step')}, "
                       f"not {self.plan.stall_step}")
        if self.metrics_culprits != [want]:
            failed = f" ({len(self.scraped.failed)} rank(s) did not answer)" if self.scraped.failed else ""
            out.append(f"/metrics names {self.metrics_culprits or 'no rank'} instead of rank {want}{failed}")
        return out

    def _ranks(self) -> str:
        return ", ".join(f"rank {c.get('rank')}" for c in self.culprits) or "no culprit"


def intro(plan: DemoPlan) -> str:
    return (f"fr-otel demo: {plan.world_size} gloo ranks on CPU under the live agent; rank {plan.stall_rank}'s "
            f"data loader stalls at training step {plan.stall_step}. Running:\n  $ {plan.shown()}\n")


def render(found: Findings, folder: Path, seconds_to_verdict: float) -> str:
    """The five sections, as text."""
    lines = [*_verdict(found, seconds_to_verdict), "", *_metrics(found), "", *_trace(found.identity), "",
             f"4. The HTML report (one self-contained page; open it in a browser): {folder / REPORT_FILE}", "",
             "5. Later, with the job gone, the dumps say the same offline:",
             f"  $ fr-otel analyze {shlex.quote(str(folder))}",
             f"  $ fr-otel report {shlex.quote(str(folder))} -o incident.html"]
    return "\n".join(printable(line) for line in lines) + "\n"


def _verdict(found: Findings, seconds: float) -> list[str]:
    ident, c = found.identity, found.first
    trigger = Trigger.from_root_attributes(ident.root_attributes)
    seen = trigger.stall if trigger is not None and trigger.stall is not None else SeenStall("?", None)
    by = trigger.raised_by if trigger is not None and trigger.raised_by >= 0 else "?"
    raised = (f"incident {ident.incident}, raised by rank {by}: "
              f"{seen.op or 'a collective'} #{seen.seq if seen.seq is not None else '?'} on group {seen.pg_name} "
              f"in flight {_num(seen.age_s)} s, over the {_num(trigger.threshold_s if trigger else None)} s threshold")
    out = [f"1. The live verdict ({raised}; {seconds:.1f} s after the start, the job still stuck):"]
    verdict = str(ident.summary.get("verdict", "?")).upper()
    if not c:
        return [*out, f"  {verdict}: no culprit named"]
    rank = c.get("rank")
    others = [f"rank {o.get('rank')} ({o.get('kind')})" for o in found.culprits[1:4]]
    out.append(f"  {verdict}: rank {rank} is the one the others wait for ({c.get('kind')})"
               + (f"; also {', '.join(others)}" if others else ""))
    process = found.processes.get(rank) if isinstance(rank, int) else None
    where = f" (pid {process.pid}, local rank {process.local_rank})" if process and process.pid else ""
    out.append(f"  host           {c.get('host') or 'unknown'}{where}")
    out.append(f"  training step  {c.get('steps') or 'unknown (no rank counted steps)'}")
    out.append(f"  stopped first  {ident.summary.get('stop_order') or 'unknown'}")
    now = ident.stacks.get(rank) if isinstance(rank, int) else None
    if now is None:
        out.append("  now            unknown (no live stack in incident.json)")
    else:
        collective = f"inside {now.in_collective}" if now.in_collective else "not in a collective"
        out.append(f"  now            {now.describe()} ({collective}; its stack at "
                   f"{format_clock(now.captured_ns) if now.captured_ns else 'incident time'}, innermost first):")
        frames = now.main.frames if now.main else ()
        out.extend(f"                   {f.filename}:{f.line} in {f.name}" for f in frames[:MAX_FRAMES])
        if len(frames) > MAX_FRAMES:
            out.append(f"                   … {len(frames) - MAX_FRAMES} more")
    out.append(f"  evidence       {str(c.get('evidence', '')).split(' Now rank', 1)[0]}")
    cause = cause_from_json(c.get("cause"))
    if cause is not None and cause.said:
        out.append(f"  cause          {cause.info.label} ({cause.cls}) [{cause.domain}]: "
                   f"{'; '.join(cause.evidence[:2])}")
    action = ident.summary.get("action")
    if isinstance(action, str) and action in set(Action):
        out.append(f"  what to do     {ACTION_WORDS[Action(action)]}")
    return out


def _metrics(found: Findings) -> list[str]:
    plan, scraped = found.plan, found.scraped
    last = plan.metrics_port + plan.world_size - 1
    out = [f"2. The culprit in /metrics (each rank's, scraped from 127.0.0.1:{plan.metrics_port}-{last} "
           + "while the job is stuck):"]
    for rank, why in sorted(scraped.failed.items()):
        out.append(f"  rank {rank}: /metrics did not answer ({why})")
    steps, step_age = scraped.by_rank("fr_training_step"), scraped.by_rank("fr_training_step_age_seconds")
    for g in found.blame:
        if not g.culprits:
            continue
        waiting = sorted(r for r, seq in g.enqueued.items() if r not in g.culprits)
        top = max(g.enqueued.values())
        out.append(f"  {g.pg_desc or 'group'} (pg_name {g.pg_name}): ranks {compress_ranks(waiting)} enqueued #{top} "
                   f"and wait in {g.op or 'it'} for {g.oldest_age_s:.1f} s; rank(s) {compress_ranks(g.culprits)} "
                   f"stopped at #{g.enqueued[g.culprits[0]]}: the one(s) they wait for")
        for s in scraped.of_group(g.pg_name):
            mark = "   <- lowest: the culprit" if s.rank in g.culprits and s.name == "fr_last_enqueued_seq" else ""
            out.append(f"    {s.text()}{mark}")
        for r in g.culprits:
            if r in steps:
                out.append(f'    fr_training_step{{rank="{r}"}} {steps[r]:g}    fr_training_step_age_seconds'
                           f'{{rank="{r}"}} {step_age.get(r, 0.0):g}   <- its step {steps[r]:g} has not ended')
    if not found.metrics_culprits:
        out.append(f"  no group shows a rank behind with a wait over {plan.stall_seconds:g} s")
    rule = (f"    {BLAME_RULE}    (with deploy/prometheus/fr-otel-rules.yml loaded: the recording rule behind the "
            f"FrOtelRankLagging alert; it blames once the group has waited 10 s)")
    out += ["  In Prometheus, the rank the others wait for is:", rule, f"    {culprit_query(plan.stall_seconds)}",
            f"      (without the rules; {plan.stall_seconds:g} s is the demo's threshold, the agent's default is 60 s)"]
    return out


def _trace(ident: IncidentIdentity) -> list[str]:
    export = ident.summary.get("export")
    export = export if isinstance(export, dict) else {}
    status, sentence, replay = export.get("status"), export.get("sentence") or "not recorded", export.get("replay")
    spans = ident.summary.get("spans")
    out = [f"3. The trace {ident.trace_id} ({spans} spans): {sentence}"]
    if status == "file":
        out.append("  Open it: Jaeger → Search → Upload → choose that file (OTLP JSON Lines); "
                   "or send it to a collector:")
        if replay:
            out.append(f"  $ {replay}")
    elif status in ("sent", "partial"):
        out.append(f"  Open it by its id: Grafana → Explore → Tempo (TraceQL) {ident.trace_id}; "
                   f"or Jaeger's search box")
    elif replay:
        out.append(f"  Send it when the collector answers: $ {replay}")
    return out


def _num(value: object) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else "?"
