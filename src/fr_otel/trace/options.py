"""What goes into an incident trace: options and defaults, light to import.

Kept apart from :mod:`fr_otel.trace.spans` (which imports the OpenTelemetry SDK) so that
command-line parsing and the analysis never pay for the SDK they may not use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TraceOptions", "DEFAULT_SERVICE_NAME", "DEFAULT_LAST_N", "DEFAULT_MAX_SPANS"]

DEFAULT_SERVICE_NAME = "pytorch-training"
DEFAULT_LAST_N = 5
DEFAULT_MAX_SPANS = 5000


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """What goes into the trace. ``last_n``: recent collectives per group per rank kept
    besides the focus; ``max_spans``: a soft cap that shrinks ``last_n`` for big jobs."""

    job_id: str | None = None
    incident: str = ""
    full: bool = False
    last_n: int = DEFAULT_LAST_N
    max_spans: int = DEFAULT_MAX_SPANS
    max_stack_frames: int = 16
    service_name: str | None = None  # argument > OTEL_SERVICE_NAME > default
    #: Extra attributes for the root span (e.g. how a live agent detected the incident);
    #: they never replace the verdict's own.
    root_attributes: tuple[tuple[str, Any], ...] = ()
    #: Tells apart several roots of one trace: each node that lost the job's store analyses its own
    #: part of the incident and exports it into the same trace, under a root of its own.
    root_key: str = ""
