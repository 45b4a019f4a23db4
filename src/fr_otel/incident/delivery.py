"""What became of one incident's trace, in the words the CLI, the watcher, the agent and the report share.

An :class:`ExportOutcome` is what a sink (:mod:`fr_otel.incident.sinks`) returns: sent to a
collector, written to the embedded OTLP JSON Lines file, spooled for ``fr-otel replay``
when the collector was down, partly rejected, or lost. This module says it (one sentence,
with why it did not arrive and the command that sends it later) and hints at the setting
to fix when the error is the user's to fix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..common.commands import replay_command_line
from ..otlp.config import ExportConfig
from ..otlp.config import Protocol as OtlpProtocol
from ..otlp.transport import NOT_GRPC, NOT_HTTP
from ..common.export_status import ExportStatus
from ..report.trace_section import TraceDelivery

if TYPE_CHECKING:  # the SDK and grpc load only when something is exported
    from ..otlp.export import ExportResult

__all__ = ["ExportFix", "ExportOutcome", "export_fix", "export_hint", "failure_reason", "rejected_note",
           "replay_command", "OUT_DIR_ENV", "DEFAULT_OUT_DIR", "DEFAULT_DEADLINE_S", "out_dir"]

OUT_DIR_ENV = "FR_OTEL_OUT_DIR"
DEFAULT_OUT_DIR = "fr-otel-out"
DEFAULT_DEADLINE_S = 30.0


@dataclass(frozen=True, slots=True)
class ExportOutcome:
    """Where the trace went (:class:`ExportStatus`), the endpoint or file, and the export's own account."""

    status: ExportStatus
    destination: str
    path: Path | None
    result: ExportResult | None

    @property
    def ok(self) -> bool:
        return self.status.arrived

    @property
    def lost(self) -> bool:
        """Some of the trace is nowhere: neither delivered, written nor spooled (the embedded file
        or the spool could not be written: a full or read-only ``--out``). Spans a collector
        rejected are not counted here: it saw them (``partial``)."""
        return self.status == ExportStatus.FAILED or (self.result is not None and self.result.spans_lost > 0)

    @property
    def where(self) -> str:
        """Where the trace is: its file when written or spooled, else the endpoint (or why nowhere)."""
        kept = self.status in (ExportStatus.FILE, ExportStatus.SPOOLED)
        return str(self.path) if self.path is not None and kept else self.destination

    @property
    def error(self) -> str:
        """Why it did not arrive: the export's own error, else the destination's account."""
        return self.result.error if self.result is not None and self.result.error else self.destination

    def for_page(self, trace_id: str, total_spans: int, config: ExportConfig) -> TraceDelivery:
        """The outcome as the HTML report's Trace section needs it, in :meth:`describe`'s words."""
        fix = export_fix(self.result.error, config) if self.result is not None and self.result.error else None
        replay = replay_command(self.path, config, fix) if self.path is not None else ""
        return TraceDelivery(trace_id, self.status, self.where, self.describe(total_spans, config), replay)

    def describe(self, total_spans: int, config: ExportConfig) -> str:
        """Where the trace went, to end a sentence that names it (``"trace … (317 spans) sent to
        http://otel:4317"``): the CLI, the watcher and the agent all say it in these words, with
        why it did not arrive and how to send it later when it did not."""
        if self.status == ExportStatus.SENT:
            return f"sent to {self.destination}"
        if self.status == ExportStatus.FILE:
            return f"written to {self.destination}"
        if self.status == ExportStatus.DISABLED:
            return "not exported: OTEL_SDK_DISABLED=true"
        why = failure_reason(self, config)
        if self.status == ExportStatus.PARTIAL and self.result is not None:
            return (f"only PARTLY delivered to {self.destination}: {rejected_note(self, total_spans)}, so only "
                    f"{self.result.spans_sent} of {total_spans} spans delivered ({why})")
        if self.path is not None:  # the command carries the fix the hint just gave
            return (f"NOT delivered ({why}); spooled to {self.path}, send it later with "
                    f"{replay_command(self.path, config, export_fix(self.error, config))}")
        return f"lost ({why})"


def out_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Argument > FR_OTEL_OUT_DIR > ./fr-otel-out."""
    return Path(explicit or os.environ.get(OUT_DIR_ENV) or DEFAULT_OUT_DIR)


def rejected_note(outcome: ExportOutcome, total: int) -> str:
    """``"the collector rejected 158 of 317 spans"`` when it did, else ``""`` (for every status line)."""
    result = outcome.result
    if result is None or not result.spans_rejected:
        return ""
    return f"the collector rejected {result.spans_rejected} of {total} spans"


_TLS_MISMATCH = re.compile(r"WRONG_VERSION_NUMBER|wrong version number|handshake failed|SSL_ERROR|TLS:", re.IGNORECASE)
_TRACES_PATH = "/v1/traces"


@dataclass(frozen=True, slots=True)
class ExportFix:
    """A setting to change after an export error the user can fix: the hint that says so, and the
    settings it gives (None: unchanged), which every command printed after the hint carries."""

    hint: str
    endpoint: str | None = None
    protocol: OtlpProtocol | None = None
    insecure: bool | None = None

    def applied(self, config: ExportConfig) -> ExportConfig:
        """``config`` with this fix."""
        return replace(config, endpoint=self.endpoint or config.endpoint, protocol=self.protocol or config.protocol,
                       insecure=config.insecure if self.insecure is None else self.insecure)


def export_fix(error: str | None, config: ExportConfig) -> ExportFix | None:
    """What to change about an export error the user can fix in their settings, or None.

    The wrong protocol for the port (gRPC to an OTLP/HTTP receiver or the reverse), a TLS
    handshake with a plaintext collector (add ``--insecure`` or write ``http://``), an
    OTLP/HTTP URL without ``/v1/traces`` (HTTP 404).
    """
    if not error:
        return None
    target = config.shown_target()
    netloc = urlsplit(target).netloc if "://" in target else target
    if NOT_HTTP in error:
        return ExportFix(f"it looks like a gRPC receiver: use --protocol grpc --endpoint http://{netloc}, or the "
                         "collector's OTLP/HTTP port (usually 4318)", endpoint=f"http://{netloc}", protocol="grpc")
    if NOT_GRPC in error:
        url = f"http://{netloc}{_TRACES_PATH}"
        return ExportFix(f"it looks like an OTLP/HTTP receiver: use --protocol http/protobuf --endpoint {url}, or "
                         "the collector's gRPC port (usually 4317)", endpoint=url, protocol="http/protobuf")
    if _TLS_MISMATCH.search(error):
        if "://" not in target:
            return ExportFix(f"the collector does not seem to speak TLS: add --insecure (or "
                             f"OTEL_EXPORTER_OTLP_INSECURE=true), or write the endpoint as http://{target}",
                             insecure=True)
        if target.startswith("https://"):
            plain = f"http://{target[len('https://'):]}"
            return ExportFix(f"the collector does not seem to speak TLS: write the endpoint as {plain}", endpoint=plain)
        return None
    if config.protocol != "grpc" and re.search(r"\bHTTP 404\b", error):
        parts = urlsplit(target)
        base = f"{parts.scheme}://{parts.netloc}"
        if not parts.path.rstrip("/").endswith(_TRACES_PATH):
            return ExportFix(f"nothing takes traces at {target}: OTLP/HTTP receivers listen on {_TRACES_PATH}; use "
                             f"--endpoint {base}{_TRACES_PATH} (or OTEL_EXPORTER_OTLP_ENDPOINT={base}, to which "
                             f"fr-otel appends {_TRACES_PATH})", endpoint=f"{base}{_TRACES_PATH}")
        return ExportFix(f"{target} answered 404: is {parts.netloc} an OTLP/HTTP receiver (usually port 4318)?")
    return None


def export_hint(error: str | None, config: ExportConfig) -> str | None:
    """The hint of :func:`export_fix`, or None."""
    fix = export_fix(error, config)
    return fix.hint if fix is not None else None


def failure_reason(outcome: ExportOutcome, config: ExportConfig) -> str:
    """Why ``outcome`` did not deliver the trace, with what to do about it when we know."""
    why = outcome.error
    hint = export_hint(why, config)
    return f"{why}; {hint}" if hint else why


def replay_command(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                   config: ExportConfig | None = None, fix: ExportFix | None = None) -> str:
    """A complete ``fr-otel replay`` command line that sends ``path`` (or several) where ``config``
    points, with ``fix`` applied (a placeholder collector when it points nowhere); see
    :func:`replay_command_line`."""
    if config is None:
        return replay_command_line(path)
    if fix is not None:
        config = fix.applied(config)
    return replay_command_line(path, endpoint=config.endpoint, protocol=config.protocol, insecure=bool(config.insecure),
                               header_names=config.headers or ())
