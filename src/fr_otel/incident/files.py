"""The files an incident leaves beside its dumps, so an offline look at the folder knows what the live one knew.

``ranks.json`` (where every rank ran: the host map), ``steps.json`` (each rank's training
steps), ``exclude-hosts.txt`` (a hang's hosts to leave out next time), ``incident.json`` (the incident's identity: job id, number, trace id, each rank's
threads at incident time, the export's outcome) and ``incident.html`` (the report). A later
``fr-otel analyze``/``report``/``export`` of the folder reads them back
(:mod:`fr_otel.read.sidecars`): the same hosts, stacks and steps, and the same trace id.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..common.files import atomic_write
from ..diagnosis.job import Job
from ..diagnosis.restart import hosts_to_exclude
from ..diagnosis.step_map import steps_file_json
from ..read.incident_file import INCIDENT_FILE, IncidentIdentity, dump_file_sizes
from ..read.rank_map import write_host_map
from ..read.steps import STEPS_FILE

if TYPE_CHECKING:
    from ..diagnosis.verdict import Verdict
    from ..otlp.config import ExportConfig
    from ..trace.spans import IncidentTrace
    from .delivery import ExportOutcome

__all__ = ["EXCLUDE_HOSTS_FILE", "INCIDENT_FILE", "REPORT_FILE", "write_identity", "write_incident_files"]

REPORT_FILE = "incident.html"
#: One host a line: the hosts a restart should leave out (:mod:`fr_otel.diagnosis.restart`); only a verdict
#: that names some writes it, so its presence alone says "this incident calls for a restart elsewhere".
EXCLUDE_HOSTS_FILE = "exclude-hosts.txt"


def write_identity(folder: str | os.PathLike[str], identity: IncidentIdentity) -> Path:
    """Write ``folder/incident.json`` atomically; returns its path (raises OSError)."""
    path = Path(folder) / INCIDENT_FILE
    atomic_write(path, json.dumps(identity.to_json(), indent=1, sort_keys=True).encode("utf-8"), mkdir=True)
    return path


def write_incident_files(folder: str | os.PathLike[str], job: Job, verdict: Verdict, trace: IncidentTrace,
                         outcome: ExportOutcome, config: ExportConfig, summary: dict[str, Any]) -> Path:
    """The host map, the step map, ``incident.json`` (with the verdict's ``summary``:
    :func:`.summary.verdict_summary`) and ``incident.html`` beside the dumps of an incident just delivered;
    returns the incident file's path (raises OSError)."""
    from ..report.html import render, write_report

    folder = Path(folder)
    if any(p.known for p in job.processes.values()):  # an empty map says nothing: none is written
        write_host_map(folder, dict(job.processes), job.world_size, job.last_heard, job.store_host, job.last_step)
    if any(d.steps is not None for d in job.dumps.values()):
        atomic_write(folder / STEPS_FILE, json.dumps(steps_file_json(job)).encode("utf-8"), mkdir=True)
    exclude = hosts_to_exclude(verdict)
    if exclude:
        atomic_write(folder / EXCLUDE_HOSTS_FILE, "".join(f"{h}\n" for h in exclude).encode("utf-8"), mkdir=True)
    identity = IncidentIdentity(
        job_id=trace.job_id, incident=trace.incident, trace_id=trace.trace_id_hex, root_attributes=trace.root_attributes,
        stacks={r: d.now for r, d in job.dumps.items() if d.now is not None},
        failed={r: d.failed for r, d in job.dumps.items() if d.failed}, network=job.network, summary=summary,
        host=job.host_facts, exits=job.exits,
        files=dump_file_sizes(job.dumps, folder),
    )
    path = write_identity(folder, identity)
    write_report(folder / REPORT_FILE, render(job, verdict, trace=outcome.for_page(trace.trace_id_hex,
                                                                                  len(trace.spans), config)))
    return path
