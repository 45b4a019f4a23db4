"""One incident end to end, composed in one place: evidence -> job -> verdict -> trace -> delivery -> files.

Every way fr-otel meets an incident runs this: ``fr-otel analyze``/``report`` (analysis only),
``fr-otel export`` (plus a trace, delivered), ``fr-otel watch`` and the live agent's
coordinator (plus the files beside the dumps), and the library call :func:`fr_otel.analyze_incident`.
Callers supply the evidence (a folder read from disk, dumps the watcher parsed one by one,
payloads the agent gathered) and an :class:`IncidentPlan`; they keep only their own
reporting. So the library gives the answer the CLI prints, and a rule about incidents (which
side files count, what the trace root says, what is written where) has one home.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..common.progress import TerminalProgress
from ..common.text import one_line
from ..diagnosis.analysis import analyze
from ..diagnosis.job import Job, build_job
from ..diagnosis.restart import hosts_to_exclude, verdict_action
from ..diagnosis.verdict import DEFAULT_STRAGGLER_THRESHOLD_S, AnalysisOptions, Verdict
from ..read.dump import RankDump
from ..read.incident_file import IncidentIdentity
from ..read.reader import ReadResult, read_dumps
from ..read.safe_pickle import DEFAULT_MAX_FILE_BYTES
from ..read.sidecars import read_sidecars
from .trigger import Trigger

if TYPE_CHECKING:  # the SDK loads only when a trace is built; the export's types only when one runs
    from ..report.trace_section import TraceDelivery
    from ..trace.options import TraceOptions
    from ..trace.spans import IncidentTrace
    from .delivery import ExportOutcome
    from .sinks import IncidentSink

__all__ = ["IncidentPlan", "IncidentResult", "NoUsableDump", "analyze_incident", "evidence_from_dumps",
           "evidence_from_files", "run_incident"]


@dataclass(frozen=True, slots=True)
class IncidentPlan:
    """How far to take an incident and where its results go."""

    analysis: AnalysisOptions = field(default_factory=AnalysisOptions)
    #: Build a trace with these options; None stops after the verdict (analyze, report).
    trace: TraceOptions | None = None
    #: Deliver the trace here; None builds it without sending it anywhere.
    sink: IncidentSink | None = None
    #: Write the host map, step map, incident.json and incident.html into this folder (watch, agent).
    files_to: Path | None = None
    #: Seconds the delivery may take at most (None: the sink's own bound).
    deadline_s: float | None = None
    progress: TerminalProgress = field(default_factory=lambda: TerminalProgress(enabled=False))
    #: Called once the trace is built, before it is delivered (the watcher records its id first).
    on_traced: Callable[[IncidentResult], None] | None = None
    #: Called with the first verdict when some dumps are compact (node summaries: columns and a few
    #: entries): it may put whole dumps in the evidence for the ranks the verdict and its trace show
    #: (the live agent asks their nodes) and says whether it did; the job is then modelled and
    #: analysed again, so the verdict and the trace read whole dumps wherever they look closely.
    complete: Callable[[Job, Verdict], bool] | None = None
    #: What raised the live incident (the agent's); None: the one incident.json kept, if any.
    trigger: Trigger | None = None


@dataclass(slots=True)
class IncidentResult:
    """What became of one incident: the job, its verdict, and (when asked) its trace, delivery and files."""

    job: Job
    verdict: Verdict
    identity: IncidentIdentity | None = None  # the live incident these dumps belong to (incident.json)
    trace: IncidentTrace | None = None
    outcome: ExportOutcome | None = None
    files: Path | None = None  # incident.json, when the files beside the dumps were written
    files_error: str | None = None  # why they could not be
    #: The verdict in short, once delivered (:func:`.summary.verdict_summary`: incident.json's and the store's).
    summary: dict[str, Any] | None = None

    @property
    def trace_id(self) -> str | None:
        """The incident's trace id: the one just built, else the live incident's (incident.json)."""
        if self.trace is not None:
            return self.trace.trace_id_hex
        return self.identity.trace_id if self.identity is not None else None

    def trace_delivery(self, config: Any = None) -> TraceDelivery | None:
        """The Trace section's facts: this delivery's outcome, else what the live incident recorded."""
        if self.trace is not None and self.outcome is not None and config is not None:
            return self.outcome.for_page(self.trace.trace_id_hex, len(self.trace.spans), config)
        if self.identity is not None:
            from ..report.trace_section import TraceDelivery

            return TraceDelivery.recorded(self.identity.trace_id, self.identity.summary)
        return None

    def to_dict(self, *, include_groups: bool = True) -> dict[str, Any]:
        """The public JSON schema: the verdict, the incident's trace id, and the export when there was one."""
        doc = self.verdict.to_dict(include_groups=include_groups)
        doc["exclude_hosts"] = list(hosts_to_exclude(self.verdict))
        doc["action"] = verdict_action(self.verdict)
        if self.trace_id is not None:
            doc["trace_id"] = self.trace_id
        if self.trace is not None and self.outcome is not None:
            result = self.outcome.result
            doc["export"] = {"status": str(self.outcome.status), "destination": self.outcome.destination,
                             "path": str(self.outcome.path) if self.outcome.path else None,
                             "spans": len(self.trace.spans),
                             "spans_rejected": result.spans_rejected if result else 0}
        return doc

    def to_json(self) -> str:
        """:meth:`to_dict` as one line of JSON, exactly what ``fr-otel analyze --json`` prints."""
        return json.dumps(self.to_dict(), separators=(",", ":"))


class NoUsableDump(ValueError):
    """Not one dump under the paths could be read; ``problems`` says why, a line per file."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("no usable Flight Recorder dump")
        self.problems = list(problems)


def analyze_incident(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, prefix: str | None = None,
    straggler_threshold_s: float = DEFAULT_STRAGGLER_THRESHOLD_S, workers: int | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, trace: TraceOptions | None = None,
    sink: IncidentSink | None = None, progress: TerminalProgress | None = None,
) -> IncidentResult:
    """The incident in ``paths`` (a folder of dumps, or dump files) as ``fr-otel analyze`` sees it.

    The one call behind the CLI's ``analyze``, ``report`` and ``export``: the dumps and every side
    file beside them (ranks.json's hosts, steps.json, incident.json's trace id and the options it
    implies), analysed; with ``trace`` a trace is built too, and with ``sink`` delivered (never
    otherwise). ``result.to_dict()`` is the public JSON schema. Raises :class:`NoUsableDump` when
    not one dump could be read.
    """
    progress = progress or TerminalProgress(enabled=False)
    evidence = evidence_from_files(paths, prefix=prefix, workers=workers, max_file_bytes=max_file_bytes,
                                   progress=progress)
    if not evidence.dumps:
        raise NoUsableDump(evidence.problems)
    plan = IncidentPlan(analysis=AnalysisOptions(straggler_threshold_s=straggler_threshold_s), trace=trace,
                        sink=sink, progress=progress)
    return run_incident(evidence, plan)


def evidence_from_files(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, prefix: str | None = None,
    workers: int | None = None, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    progress: TerminalProgress | None = None,
) -> ReadResult:
    """Every rank's dump under ``paths`` and every side file beside them (see :func:`read_dumps`)."""
    with (progress or TerminalProgress(enabled=False)).task("reading dumps", "files") as update:
        return read_dumps(paths, prefix=prefix, workers=workers, progress=update, max_file_bytes=max_file_bytes)


def evidence_from_dumps(dumps: dict[int, RankDump], problems: list[str], folder: Path) -> ReadResult:
    """Dumps parsed one by one (the watcher's), with the side files of their folder."""
    read = ReadResult(dumps=dumps, problems=problems)
    read.side = read_sidecars([folder], dumps, problems)
    return read


def run_incident(evidence: ReadResult, plan: IncidentPlan) -> IncidentResult:
    """Model the job, analyse it, and as the plan asks build, deliver and file its trace.

    Analysis and trace building raise on a bug (the caller decides what that costs); the
    delivery never raises (a failure is its outcome), nor does writing the files (``files_error``).
    """
    job = build_job(evidence)
    identity = evidence.side.identity
    options = _analysis_options(plan, identity)
    verdict = analyze(job, options)
    if plan.complete is not None and any(d.compact for d in evidence.dumps.values()) and plan.complete(job, verdict):
        job = build_job(evidence)
        verdict = analyze(job, options)
    result = IncidentResult(job, verdict, identity)
    if plan.trace is None:
        return result
    from ..trace.spans import (
        build_trace,  # the OpenTelemetry SDK loads only when a trace is built
    )

    with plan.progress.task("building spans", "ranks") as update:
        result.trace = build_trace(job, result.verdict, _with_identity(plan.trace, identity), progress=update)
    if plan.on_traced is not None:
        plan.on_traced(result)
    if plan.sink is None:
        return result
    with plan.progress.task("encoding spans", "spans") as encoded, plan.progress.task("sending spans", "spans") as sent:
        result.outcome = plan.sink.deliver(result.trace, deadline_s=plan.deadline_s, progress=sent, encoding=encoded)
    from .summary import verdict_summary

    result.summary = verdict_summary(result.verdict, result.trace, result.outcome, plan.sink.config)
    if plan.files_to is not None:
        _write_files(result, plan)
    return result


def _analysis_options(plan: IncidentPlan, identity: IncidentIdentity | None) -> AnalysisOptions:
    """The analysis as the incident's trigger asks (:meth:`.trigger.Trigger.analysis`): the live agent's, or
    the one incident.json kept; a folder no live incident left is analysed as it is."""
    trigger = plan.trigger
    if trigger is None and identity is not None:
        trigger = Trigger.from_root_attributes(identity.root_attributes)
    return trigger.analysis(plan.analysis) if trigger is not None else plan.analysis


def _with_identity(options: TraceOptions, identity: IncidentIdentity | None) -> TraceOptions:
    """The live incident's identity (incident.json) where the caller named none: the same trace id
    and root attributes as the trace the agent sent, so a re-export lands in that trace."""
    if identity is None or options.job_id:
        return options
    return replace(options, job_id=identity.job_id, incident=options.incident or identity.incident,
                   root_attributes=options.root_attributes or identity.root_attributes)


def _write_files(result: IncidentResult, plan: IncidentPlan) -> None:
    from .files import write_incident_files

    assert plan.files_to is not None and result.trace is not None and plan.sink is not None
    assert result.outcome is not None and result.summary is not None
    try:
        result.files = write_incident_files(plan.files_to, result.job, result.verdict, result.trace, result.outcome,
                                            plan.sink.config, result.summary)
    except OSError as exc:
        result.files_error = f"{plan.files_to}: cannot write the incident's files there ({exc.strerror or one_line(exc)})"
