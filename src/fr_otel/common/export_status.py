"""Where an incident's trace went: the one word the export (:mod:`fr_otel.incident.delivery`), the page's Trace
section, the watcher's state and ``incident.json`` all use for it."""

from __future__ import annotations

from .str_enum import StrEnum

__all__ = ["ExportStatus"]


class ExportStatus(StrEnum):
    """Where an incident's trace went."""

    FILE = "file"  # written to the embedded OTLP JSON Lines file
    SENT = "sent"  # every span delivered to the collector
    PARTIAL = "partial"  # delivered, but the collector rejected some spans
    SPOOLED = "spooled"  # not delivered: written to a spool file for `fr-otel replay`
    FAILED = "failed"  # neither delivered nor kept: lost
    DISABLED = "disabled"  # OTEL_SDK_DISABLED=true

    @property
    def arrived(self) -> bool:
        """The trace is where the user asked for it (or they asked for none)."""
        return self in (ExportStatus.FILE, ExportStatus.SENT, ExportStatus.DISABLED)
