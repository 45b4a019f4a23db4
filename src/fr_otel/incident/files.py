"""``incident.json``: one incident's identity, kept next to its dumps.

The live agent sends a trace whose id is ``trace_id_for(job id, incident number)`` and
leaves the ranks' dumps in a folder. Dump files do not know that job id, nor where each
rank ran or what it was doing at incident time (those travelled in the agent's payloads),
so an offline ``fr-otel export`` of the folder would mint another trace id and lose the
context. The coordinator therefore writes this file beside the dumps; ``export``,
``report``, ``analyze`` and ``watch`` read it, so the trace id matches the one the agent
sent, re-exports are idempotent, and host, pid and live stacks survive.

The file is untrusted input like the dumps: it is read by :mod:`fr_otel.read.side_files`
(regular file, size and depth caps, every string escaped, ASCII rank keys, root attributes
capped), unknown keys are ignored, ill-typed values dropped, and a file that cannot be used
costs one problem line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..common.files import atomic_write
from ..common.names import identity_problem, is_trace_id
from ..common.text import printable
from ..diagnosis.job import Job
from ..read.live_stack import LiveStacks, stacks_from_raw
from ..read.rank_process import RankProcess, process_from_raw
from ..read.rank_map import per_rank_processes
from ..read.side_files import bounded_attributes, read_side_file, side_file_present
from ..report.trace_section import DELIVERY_STATUSES, TraceDelivery
from ..trace.ids import trace_id_for

if TYPE_CHECKING:
    from ..diagnosis.verdict import Verdict
    from ..otlp.config import ExportConfig
    from ..trace.spans import IncidentTrace
    from .delivery import ExportOutcome

__all__ = ["INCIDENT_FILE", "REPORT_FILE", "FORMAT", "ROOT_ATTRIBUTE_PREFIX", "IncidentIdentity", "find_identity",
           "read_identity", "write_identity", "write_incident_files", "apply_identity"]

INCIDENT_FILE = "incident.json"
REPORT_FILE = "incident.html"
FORMAT = "fr-otel/incident/1"
#: The root attributes an incident file may carry: the agent's own (how it detected the incident).
ROOT_ATTRIBUTE_PREFIX = "fr_otel.incident."


@dataclass(slots=True)
class IncidentIdentity:
    """Who the incident is (job id, number, trace id) and what the agent knew per rank."""

    job_id: str
    incident: str
    trace_id: str
    root_attributes: tuple[tuple[str, Any], ...] = ()
    processes: dict[int, RankProcess] = field(default_factory=dict)
    stacks: dict[int, LiveStacks] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)  # verdict, culprits, export outcome (for people)
    files: dict[str, int] = field(default_factory=dict)  # dump file name -> size it had (empty: not checked)
    path: str = ""

    def stale_for(self, job: Job) -> str | None:
        """Why this identity does not describe ``job``'s dump files (a newer incident overwrote
        them beside an old incident.json), or None when it does or cannot tell."""
        if not self.files:
            return None
        now = _dump_files(job)
        changed = sorted(n for n in set(now) | set(self.files) if now.get(n) != self.files.get(n))
        return f"the dump files changed since it was written ({', '.join(changed[:3])})" if changed else None

    def trace_delivery(self) -> TraceDelivery:
        """What became of the live incident's trace, as its export recorded it in ``summary``
        (for the report of a folder with an incident.json); an unreadable record says so."""
        export = self.summary.get("export")
        export = export if isinstance(export, dict) else {}

        def text(key: str, limit: int) -> str:
            value = export.get(key)
            return printable(value)[:limit] if isinstance(value, str) else ""

        status = text("status", 16)
        if status not in DELIVERY_STATUSES or not text("sentence", 1):
            return TraceDelivery(self.trace_id)
        return TraceDelivery(self.trace_id, status, text("where", 4096), text("sentence", 4096), text("replay", 4096))

    def to_json(self) -> dict[str, Any]:
        ranks: dict[str, dict[str, Any]] = {}
        for rank in sorted(set(self.processes) | set(self.stacks)):
            doc: dict[str, Any] = {}
            if rank in self.processes:
                doc.update(self.processes[rank].as_json())
            if rank in self.stacks:
                doc["now"] = self.stacks[rank].as_json()
            ranks[str(rank)] = doc
        return {
            "format": FORMAT,
            "job_id": self.job_id,
            "incident": self.incident,
            "trace_id": self.trace_id,
            "root_attributes": [[k, v] for k, v in self.root_attributes],
            "summary": self.summary,
            "ranks": ranks,
            "files": self.files,
        }


def write_identity(folder: str | os.PathLike[str], identity: IncidentIdentity) -> Path:
    """Write ``folder/incident.json`` atomically; returns its path (raises OSError)."""
    path = Path(folder) / INCIDENT_FILE
    atomic_write(path, json.dumps(identity.to_json(), indent=1, sort_keys=True).encode("utf-8"), mkdir=True)
    return path


def write_incident_files(folder: str | os.PathLike[str], job: Job, verdict: Verdict, trace: IncidentTrace,
                         outcome: ExportOutcome, config: ExportConfig) -> Path:
    """``incident.json`` (the identity offline tools pick up) and ``incident.html`` beside the dumps
    of an incident just exported (by the agent's coordinator or ``fr-otel watch``); raises OSError."""
    from ..report.html import render, write_report

    page = outcome.for_page(trace.trace_id_hex, len(trace.spans), config)
    summary = {
        "verdict": verdict.verdict,
        "culprits": [{"rank": c.rank, "kind": c.kind, "evidence": c.evidence, **(c.now_dict() or {})}
                     for c in verdict.culprits[:64]],
        "export": {"status": outcome.status, "destination": outcome.destination, "where": page.where,
                   "sentence": page.sentence, "replay": page.replay},
        "spans": len(trace.spans),
    }
    identity = IncidentIdentity(
        job_id=trace.job_id, incident=trace.incident, trace_id=trace.trace_id_hex, root_attributes=trace.root_attributes,
        processes=dict(job.processes), stacks={r: d.now for r, d in job.dumps.items() if d.now is not None},
        summary=summary, files=_dump_files(job, Path(folder)),
    )
    path = write_identity(folder, identity)
    write_report(Path(folder) / REPORT_FILE, render(job, verdict, trace=page))
    return path


def find_identity(paths: Sequence[str | os.PathLike[str]], problems: list[str]) -> IncidentIdentity | None:
    """The identity of the dump folder among ``paths`` (a folder, or the folder of its files), if any.

    Anything named ``incident.json`` there is read (a FIFO or a looping link costs a problem
    line, as a dump would), so a bad one is said, not skipped in silence."""
    folders = {Path(p) if Path(p).is_dir() else Path(p).parent for p in paths}
    found = [f / INCIDENT_FILE for f in sorted(folders) if side_file_present(str(f / INCIDENT_FILE))]
    if len(found) > 1:
        problems.append(f"{found[0]}: several incident files among the inputs ({', '.join(map(str, found[1:]))}); "
                        "using none")
        return None
    return read_identity(found[0], problems) if found else None


def read_identity(path: str | os.PathLike[str], problems: list[str]) -> IncidentIdentity | None:
    """Parse one ``incident.json`` through the side-file reader (:mod:`fr_otel.read.side_files`);
    None (and one problem line) when unusable. The job id, incident key and trace id must be
    identities (:func:`fr_otel.common.names.identity_problem`) and agree with each other."""
    path = str(path)
    raw = read_side_file(path, problems, "ignored")
    if raw is None:
        return None
    if raw.get("format") != FORMAT:
        problems.append(f"{path}: not an fr-otel incident file (format {FORMAT!r} expected); ignored")
        return None
    job_id, incident, trace_id = raw.get("job_id"), raw.get("incident"), raw.get("trace_id")
    if not (isinstance(job_id, str) and job_id and isinstance(incident, str) and isinstance(trace_id, str)):
        problems.append(f"{path}: incident file without job_id, incident and trace_id strings; ignored")
        return None
    why = identity_problem(job_id, "job_id") or identity_problem(incident, "incident")
    if why is None and not (is_trace_id(trace_id) and trace_id == f"{trace_id_for(job_id, incident):032x}"):
        why = "its trace_id is not the one its job_id and incident give"
    if why is not None:
        problems.append(f"{path}: {why}; ignored")
        return None
    per_rank = per_rank_processes(path, raw, problems, "hosts, pids and stacks from it unknown", _rank_entry)
    processes = {r: p for r, (p, _) in per_rank.items() if p is not None}
    stacks = {r: now for r, (_, now) in per_rank.items() if now is not None}
    root_attributes = bounded_attributes(path, raw.get("root_attributes"), problems, ROOT_ATTRIBUTE_PREFIX)
    summary = raw.get("summary")
    files = raw.get("files")
    files = {k: v for k, v in files.items() if type(v) is int} if isinstance(files, dict) else {}
    return IncidentIdentity(job_id, incident, trace_id, root_attributes, processes, stacks,
                            summary if isinstance(summary, dict) else {}, files, path)


def _rank_entry(doc: Any) -> tuple[RankProcess | None, LiveStacks | None] | None:
    """One rank's entry of an incident file: where it ran and its stacks at incident time."""
    if not isinstance(doc, dict):
        return None
    process, now = process_from_raw(doc, "incident file"), stacks_from_raw(doc.get("now"))
    return (process, now) if process is not None or now is not None else None


def _dump_files(job: Job, folder: Path | None = None) -> dict[str, int]:
    """Name -> size of the job's dumps that are files (in ``folder``, when given)."""
    out: dict[str, int] = {}
    for d in job.dumps.values():
        path = Path(d.path)
        if folder is not None and path.parent.resolve() != folder.resolve():
            continue
        try:
            out[path.name] = path.stat().st_size
        except OSError:
            continue
    return out


def apply_identity(job: Job, identity: IncidentIdentity) -> None:
    """Fill in what the dump files cannot say: where each rank ran and its threads' stacks
    at incident time (what the dumps themselves carry wins)."""
    for rank, process in identity.processes.items():
        if rank in job.dumps:
            job.processes.setdefault(rank, process)
    for rank, now in identity.stacks.items():
        dump = job.dumps.get(rank)
        if dump is not None and dump.now is None:
            dump.now = now
