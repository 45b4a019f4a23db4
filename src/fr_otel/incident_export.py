"""Send one incident's trace where the user's configuration says, losing nothing.

With an OTLP endpoint configured (flags or the standard ``OTEL_EXPORTER_OTLP_*``
variables) the spans are sent in chunks under a hard deadline, and what could not
be delivered is spooled to an OTLP JSON Lines file for ``fr-otel replay``. With
no endpoint configured, the embedded default writes that file directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from .otlp_config import ExportConfig

if TYPE_CHECKING:  # the SDK and grpc load only when something is exported
    from .otlp_export import ExportResult
    from .spans import IncidentTrace

__all__ = ["ExportOutcome", "deliver_trace", "OUT_DIR_ENV", "DEFAULT_OUT_DIR", "DEFAULT_DEADLINE_S"]

OUT_DIR_ENV = "FR_OTEL_OUT_DIR"
DEFAULT_OUT_DIR = "fr-otel-out"
DEFAULT_DEADLINE_S = 30.0


@dataclass(frozen=True, slots=True)
class ExportOutcome:
    """Where the trace went: ``file`` (embedded), ``sent``, ``spooled`` or ``disabled``."""

    status: str
    destination: str
    path: Path | None
    result: ExportResult | None

    @property
    def ok(self) -> bool:
        return self.status in ("file", "sent", "disabled")


def out_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Argument > FR_OTEL_OUT_DIR > ./fr-otel-out."""
    return Path(explicit or os.environ.get(OUT_DIR_ENV) or DEFAULT_OUT_DIR)


def deliver_trace(
    trace: IncidentTrace,
    config: ExportConfig,
    *,
    directory: str | os.PathLike[str] | None = None,
    deadline_s: float | None = None,
) -> ExportOutcome:
    """Export ``trace`` to the configured endpoint, or write it to the embedded file."""
    from .otlp_export import export_spans, write_embedded

    folder = out_dir(directory)
    name = f"fr-otel-trace-{trace.trace_id_hex}.jsonl"
    if config.disabled:
        return ExportOutcome("disabled", "nowhere (OTEL_SDK_DISABLED=true)", None, None)
    if config.endpoint is None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = write_embedded(trace.spans, folder, name)
        except OSError as exc:
            return ExportOutcome("failed", f"{folder}: {exc.strerror or exc}", None, None)
        return ExportOutcome("file", str(path), path, None)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        spool_dir: Path | None = folder
    except OSError:
        spool_dir = None
    result = export_spans(
        trace.spans,
        config,
        deadline_s=deadline_s if deadline_s is not None else min(config.timeout_s, DEFAULT_DEADLINE_S),
        spool_dir=spool_dir,
    )
    if result.ok:
        return ExportOutcome("sent", result.endpoint, None, result)
    return ExportOutcome("spooled" if result.spool_path else "failed", result.endpoint, result.spool_path, result)
