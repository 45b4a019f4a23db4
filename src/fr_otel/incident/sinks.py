"""Where an incident's trace goes: the exporter seam.

An :class:`IncidentSink` takes one built trace and says where it went, as an
:class:`~fr_otel.incident.delivery.ExportOutcome`; it never raises for the network or the
disk (a failure is an outcome). Two ship: :class:`OtlpSink` (a collector, in chunks under a
deadline, the rest spooled for ``fr-otel replay``) and :class:`JsonlFileSink` (the embedded
default: an OTLP JSON Lines file). :func:`sink_for` picks one from the standard
``OTEL_EXPORTER_OTLP_*`` configuration. A new destination is one class here with a
``deliver`` method, handed to the pipeline (:mod:`fr_otel.incident.pipeline`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..otlp.config import ExportConfig
from ..common.export_status import ExportStatus
from .delivery import DEFAULT_DEADLINE_S, ExportOutcome, out_dir

if TYPE_CHECKING:  # the SDK and grpc load only when something is exported
    from ..common.progress import ProgressCallback
    from ..trace.spans import IncidentTrace

__all__ = ["DisabledSink", "IncidentSink", "JsonlFileSink", "OtlpSink", "sink_for", "trace_file_name"]


class IncidentSink(Protocol):
    """One destination for incident traces."""

    @property
    def config(self) -> ExportConfig:
        """The settings its outcome's sentences and replay commands are written for (read-only:
        the frozen sinks' field is)."""
        ...

    def deliver(self, trace: IncidentTrace, *, deadline_s: float | None = None,
                progress: ProgressCallback | None = None,
                encoding: ProgressCallback | None = None) -> ExportOutcome:
        """Send or write ``trace``; ``encoding``/``progress`` follow spans encoded and sent. Never raises."""
        ...


def trace_file_name(trace: IncidentTrace) -> str:
    """The embedded file's name: one per trace id, so a re-export replaces it."""
    return f"fr-otel-trace-{trace.trace_id_hex}.jsonl"


@dataclass(frozen=True, slots=True)
class DisabledSink:
    """``OTEL_SDK_DISABLED=true``: nothing leaves the process, and the outcome says so."""

    config: ExportConfig

    def deliver(self, trace: IncidentTrace, *, deadline_s: float | None = None,
                progress: ProgressCallback | None = None,
                encoding: ProgressCallback | None = None) -> ExportOutcome:
        return ExportOutcome(ExportStatus.DISABLED, "nowhere (OTEL_SDK_DISABLED=true)", None, None)


@dataclass(frozen=True, slots=True)
class JsonlFileSink:
    """The embedded default: the trace as one OTLP JSON Lines file in ``folder``."""

    config: ExportConfig
    folder: Path

    def deliver(self, trace: IncidentTrace, *, deadline_s: float | None = None,
                progress: ProgressCallback | None = None,
                encoding: ProgressCallback | None = None) -> ExportOutcome:
        from ..otlp.export import write_embedded

        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = write_embedded(trace.spans, self.folder, trace_file_name(trace), encoding=encoding)
        except OSError as exc:
            return ExportOutcome(ExportStatus.FAILED, f"{self.folder}: {exc.strerror or exc}", None, None)
        except Exception as exc:  # noqa: BLE001 - a sink reports, never raises
            return ExportOutcome(ExportStatus.FAILED, f"{type(exc).__name__}: {exc}", None, None)
        return ExportOutcome(ExportStatus.FILE, str(path), path, None)


@dataclass(frozen=True, slots=True)
class OtlpSink:
    """A collector over OTLP (gRPC or HTTP), under a deadline; what it did not take is spooled
    to ``spool_folder`` (None: it is lost, and the outcome says so)."""

    config: ExportConfig
    spool_folder: Path | None

    def deliver(self, trace: IncidentTrace, *, deadline_s: float | None = None,
                progress: ProgressCallback | None = None,
                encoding: ProgressCallback | None = None) -> ExportOutcome:
        from ..otlp.export import export_spans

        spool_dir = self.spool_folder
        if spool_dir is not None:
            try:
                spool_dir.mkdir(parents=True, exist_ok=True)
            except OSError:
                spool_dir = None
        deadline = deadline_s if deadline_s is not None else min(self.config.timeout_s, DEFAULT_DEADLINE_S)
        try:
            result = export_spans(trace.spans, self.config, deadline_s=deadline, spool_dir=spool_dir,
                                  progress=progress, encoding=encoding)
        except Exception as exc:  # noqa: BLE001 - a sink reports, never raises
            return ExportOutcome(ExportStatus.FAILED, f"{type(exc).__name__}: {exc}", None, None)
        if result.ok:
            return ExportOutcome(ExportStatus.SENT, result.endpoint, None, result)
        if result.spool_path:
            return ExportOutcome(ExportStatus.SPOOLED, result.endpoint, result.spool_path, result)
        if result.spans_rejected and not result.spans_lost:
            return ExportOutcome(ExportStatus.PARTIAL, result.endpoint, None, result)
        return ExportOutcome(ExportStatus.FAILED, result.endpoint, None, result)


def sink_for(config: ExportConfig, directory: str | os.PathLike[str] | None = None) -> IncidentSink:
    """The sink the configuration asks for: disabled, a collector (spooling to the out folder),
    or the embedded file in the out folder (argument > ``FR_OTEL_OUT_DIR`` > ``./fr-otel-out``).
    Paths are absolute, so every command printed about them works from any folder."""
    folder = out_dir(directory).absolute()
    if config.disabled:
        return DisabledSink(config)
    if config.endpoint is None:
        return JsonlFileSink(config, folder)
    return OtlpSink(config, folder)
