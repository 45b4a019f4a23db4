"""The watcher's part in one incident: its inputs to the incident pipeline, and its bookkeeping.

The pipeline (:mod:`fr_otel.incident.pipeline`) analyses the dumps, delivers the trace and
leaves the files beside them. The watcher adds what only it knows (each rank's host where it
can vouch for it, into ``ranks.json`` first) and records the incident in its state: once
the trace id is known (a watcher killed mid-export re-exports under the same number) and once
delivered. Nothing here raises: an analysis that fails is recorded as ``error`` (a restarted
watcher retries it).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..common.log import logger
from ..common.names import host_name
from ..common.progress import TerminalProgress
from ..diagnosis.verdict import AnalysisOptions
from ..common.export_status import ExportStatus
from ..incident.pipeline import (
    IncidentPlan,
    IncidentResult,
    evidence_from_dumps,
    run_incident,
)
from ..incident.sinks import sink_for
from ..otlp.config import ExportConfig
from ..read.discovery import host_from_name
from ..read.dump import RankDump
from ..read.rank_map import RANKS_FILE, add_hosts, read_rank_map, write_host_map
from ..read.side_files import side_file_present
from ..trace.options import TraceOptions
from .mounts import is_shared_filesystem
from .state import Incident

__all__ = ["IncidentExport"]

_log = logger("fr_otel.watch")


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
        self.sink = sink_for(export, out_dir)
        self._progress = progress
        self._say_once = say_once

    def run(self, incident: Incident, dumps: dict[int, RankDump], problems: list[str],
            record: Callable[[bool], None]) -> None:
        """Fill in ``incident`` (verdict, trace id, where the trace went); ``record(final)`` saves it:
        once before delivery (not final: a watcher killed mid-export re-exports under this number)
        and once when done."""
        number = incident.number
        label = f"{self.trace.incident}/watch-{number}" if self.trace.incident else f"watch-{number}"

        def traced(result: IncidentResult) -> None:
            assert result.trace is not None
            incident.trace_id, incident.verdict = result.trace.trace_id_hex, result.verdict.verdict
            incident.culprits = [c.rank for c in result.verdict.blamed]
            incident.missing = sorted(set(incident.missing) | set(result.verdict.missing_ranks))
            record(False)

        plan = IncidentPlan(analysis=self.analysis, trace=replace(self.trace, incident=label), sink=self.sink,
                            files_to=self.folder, progress=self._progress, on_traced=traced)
        try:
            self._note_hosts(dumps)
            result = run_incident(evidence_from_dumps(dumps, problems, self.folder), plan)
        except Exception as exc:  # noqa: BLE001 - one bad incident must not stop the watcher
            if incident.trace_id is None:
                incident.status, incident.destination = "error", f"analysis failed: {type(exc).__name__}: {exc}"
                _log.info("incident %d: %s; not exported", number, incident.destination)
            else:
                incident.status, incident.destination = str(ExportStatus.FAILED), f"{type(exc).__name__}: {exc}"
            record(True)
            return
        assert result.trace is not None and result.outcome is not None
        outcome = result.outcome
        incident.status, incident.destination = str(outcome.status), outcome.destination
        incident.spool_path = outcome.where if outcome.status == ExportStatus.SPOOLED else None
        record(True)
        if result.files_error:
            self._say_once(f"{result.files_error}; `fr-otel export` of this folder will not know the trace id")
        culprits = ",".join(map(str, incident.culprits)) or "none"
        head = (f"incident {number}: {result.verdict.verdict}, culprit ranks {culprits}; trace "
                f"{result.trace.trace_id_hex} ({len(result.trace.spans)} spans)")
        _log.info("%s %s", head, outcome.describe(len(result.trace.spans), self.export))

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
            write_host_map(folder, {**known, **added})
        except OSError as exc:
            self._say_once(f"{path}: cannot write ({exc.strerror or exc}); a later `fr-otel analyze` of the folder "
                           "will not know the ranks' hosts")
