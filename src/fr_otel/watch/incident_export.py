"""The export step of one incident: analyse its dumps, deliver its trace, leave its files beside them.

Beside the dumps go ``ranks.json`` (each rank's host where this watcher can vouch for it),
``incident.json`` and ``incident.html``: a later ``fr-otel export`` or ``analyze`` of the
folder then knows the hosts and gives the same trace id. Nothing here raises: an analysis
that fails is recorded as ``error`` (a restarted watcher retries it), an export that
fails as ``failed``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..common.names import host_name
from ..common.progress import TerminalProgress
from ..diagnosis.analysis import analyze
from ..diagnosis.job import build_job
from ..diagnosis.verdict import AnalysisOptions
from ..incident.delivery import ExportOutcome, deliver_trace
from ..incident.files import INCIDENT_FILE, REPORT_FILE, write_incident_files
from ..otlp.config import ExportConfig
from ..read.discovery import attach_sidecars, host_from_name
from ..read.dump import RankDump
from ..read.rank_map import RANKS_FILE, add_hosts, read_rank_map, write_rank_map
from ..read.side_files import side_file_present
from ..read.reader import ReadResult
from ..trace.options import TraceOptions
from .mounts import is_shared_filesystem
from .state import Incident

__all__ = ["IncidentExport"]

_log = logging.getLogger("fr_otel.watch")


class IncidentExport:
    """How a watcher exports its incidents: where the dumps are, where traces go, how they are built."""

    def __init__(
        self,
        folder: Path,
        export: ExportConfig,
        trace: TraceOptions,
        analysis: AnalysisOptions,
        *,
        out_dir: str | None,
        progress: TerminalProgress,
        say_once: Callable[[str], None],
    ) -> None:
        self.folder = folder
        self.export = export
        self.trace = trace
        self.analysis = analysis
        self.out_dir = out_dir
        self._progress = progress
        self._say_once = say_once

    def run(self, incident: Incident, dumps: dict[int, RankDump], problems: list[str],
            record: Callable[[bool], None]) -> None:
        """Fill in ``incident`` (verdict, trace id, where the trace went); ``record(final)`` saves it:
        once before delivery (not final: a watcher killed mid-export re-exports under this number)
        and once when done."""
        number = incident.number
        label = f"{self.trace.incident}/watch-{number}" if self.trace.incident else f"watch-{number}"
        try:
            from ..trace.spans import (
                build_trace,  # the OpenTelemetry SDK loads only when there is something to export
            )

            self._note_hosts(dumps)
            attach_sidecars(dumps, problems, [self.folder])  # ranks.json, steps.json, when someone wrote them
            job = build_job(ReadResult(dumps=dumps, problems=problems))
            verdict = analyze(job, self.analysis)
            with self._progress.task("building spans", "ranks") as update:
                trace = build_trace(job, verdict, replace(self.trace, incident=label), progress=update)
        except Exception as exc:  # noqa: BLE001 - one bad incident must not stop the watcher
            incident.status, incident.destination = "error", f"analysis failed: {type(exc).__name__}: {exc}"
            record(True)
            _log.info("incident %d: %s; not exported", number, incident.destination)
            return
        incident.trace_id, incident.verdict = trace.trace_id_hex, verdict.verdict
        incident.culprits = [c.rank for c in verdict.culprits]
        incident.missing = sorted(set(incident.missing) | set(verdict.missing_ranks))
        record(False)
        try:
            with self._progress.task("encoding spans", "spans") as encoded, \
                    self._progress.task("sending spans", "spans") as sent:
                outcome = deliver_trace(trace, self.export, directory=self.out_dir, progress=sent, encoding=encoded)
        except Exception as exc:  # noqa: BLE001 - recorded as failed, so it is not retried every poll
            outcome = ExportOutcome("failed", f"{type(exc).__name__}: {exc}", None, None)
        incident.status, incident.destination = outcome.status, outcome.destination
        incident.spool_path = outcome.where if outcome.status == "spooled" else None
        record(True)
        try:  # the identity beside the dumps: a later `fr-otel export DIR` gives this same trace id
            write_incident_files(self.folder, job, verdict, trace, outcome, self.export)
        except OSError as exc:
            self._say_once(f"{self.folder}: cannot write {INCIDENT_FILE} and {REPORT_FILE} there "
                           f"({exc.strerror or exc}); `fr-otel export` of this folder will not know the trace id")
        culprits = ",".join(map(str, incident.culprits)) or "none"
        head = f"incident {number}: {verdict.verdict}, culprit ranks {culprits}; trace {trace.trace_id_hex} " \
               f"({len(trace.spans)} spans)"
        _log.info("%s %s", head, outcome.describe(len(trace.spans), self.export))

    def _note_hosts(self, dumps: dict[int, RankDump]) -> None:
        """Add to ``ranks.json`` beside the dumps each rank's host where this watcher can vouch
        for it: the host in the dump's file name, else this host when the folder is on a local
        disk (then only this machine wrote there). Hosts already in the map stay."""
        folder = self.folder
        path = folder / RANKS_FILE
        seen: list[str] = []
        known = read_rank_map(str(path), seen) if side_file_present(str(path)) else {}
        if seen:
            return  # unreadable: the analysis reports it; never overwrite what we cannot read
        local = host_name(socket.gethostname()) if is_shared_filesystem(folder) is False else None
        hosts = {r: h for r, d in dumps.items() if (h := host_from_name(d.path) or local)}
        added = add_hosts(known, hosts, "watch")
        if not added:
            return
        for rank, process in added.items():
            if dumps[rank].process is None:
                dumps[rank].process = process  # this analysis knows it even if the file cannot be written
        try:
            write_rank_map(folder, {**known, **added})
        except OSError as exc:
            self._say_once(f"{path}: cannot write ({exc.strerror or exc}); a later `fr-otel analyze` of the folder "
                           "will not know the ranks' hosts")
