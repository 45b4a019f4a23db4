"""Send one incident's trace where the user's configuration says, losing nothing.

With an OTLP endpoint configured (flags or the standard ``OTEL_EXPORTER_OTLP_*``
variables) the spans are sent in chunks under a hard deadline, and what could not
be delivered is spooled to an OTLP JSON Lines file for ``fr-otel replay``. With
no endpoint configured, the embedded default writes that file directly.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..common.commands import replay_command_line
from ..otlp.config import ExportConfig
from ..otlp.transport import NOT_GRPC, NOT_HTTP
from ..report.trace_section import TraceDelivery

if TYPE_CHECKING:  # the SDK and grpc load only when something is exported
    from ..common.progress import ProgressCallback
    from ..otlp.export import ExportResult
    from ..trace.spans import IncidentTrace

__all__ = ["ExportOutcome", "deliver_trace", "export_hint", "failure_reason", "rejected_note", "replay_command",
           "OUT_DIR_ENV", "DEFAULT_OUT_DIR", "DEFAULT_DEADLINE_S", "out_dir"]

OUT_DIR_ENV = "FR_OTEL_OUT_DIR"
DEFAULT_OUT_DIR = "fr-otel-out"
DEFAULT_DEADLINE_S = 30.0


@dataclass(frozen=True, slots=True)
class ExportOutcome:
    """Where the trace went: ``file`` (embedded), ``sent``, ``partial`` (sent, but the collector
    rejected some spans), ``spooled``, ``failed`` or ``disabled``."""

    status: str
    destination: str
    path: Path | None
    result: ExportResult | None

    @property
    def ok(self) -> bool:
        return self.status in ("file", "sent", "disabled")

    @property
    def lost(self) -> bool:
        """Some of the trace is nowhere: neither delivered, written nor spooled (the embedded file
        or the spool could not be written: a full or read-only ``--out``). Spans a collector
        rejected are not counted here: it saw them (``partial``)."""
        return self.status == "failed" or (self.result is not None and self.result.spans_lost > 0)

    @property
    def where(self) -> str:
        """Where the trace is: its file when written or spooled, else the endpoint (or why nowhere)."""
        return str(self.path) if self.path is not None and self.status in ("file", "spooled") else self.destination

    def for_page(self, trace_id: str, total_spans: int, config: ExportConfig) -> TraceDelivery:
        """The outcome as the HTML report's Trace section needs it, in :meth:`describe`'s words."""
        replay = replay_command(self.path, config) if self.path is not None else ""
        return TraceDelivery(trace_id, self.status, self.where, self.describe(total_spans, config), replay)

    def describe(self, total_spans: int, config: ExportConfig) -> str:
        """Where the trace went, to end a sentence that names it (``"trace … (317 spans) sent to
        http://otel:4317"``): the CLI, the watcher and the agent all say it in these words, with
        why it did not arrive and how to send it later when it did not."""
        if self.status == "sent":
            return f"sent to {self.destination}"
        if self.status == "file":
            return f"written to {self.destination}"
        if self.status == "disabled":
            return "not exported: OTEL_SDK_DISABLED=true"
        why = failure_reason(self, config)
        if self.status == "partial" and self.result is not None:
            return (f"only PARTLY delivered to {self.destination}: {rejected_note(self, total_spans)}, so only "
                    f"{self.result.spans_sent} of {total_spans} spans delivered ({why})")
        if self.path is not None:
            return (f"NOT delivered ({why}); spooled to {self.path}, send it later with "
                    f"{replay_command(self.path, config)}")
        return f"lost ({why})"


def out_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Argument > FR_OTEL_OUT_DIR > ./fr-otel-out."""
    return Path(explicit or os.environ.get(OUT_DIR_ENV) or DEFAULT_OUT_DIR)


def deliver_trace(
    trace: IncidentTrace,
    config: ExportConfig,
    *,
    directory: str | os.PathLike[str] | None = None,
    deadline_s: float | None = None,
    progress: ProgressCallback | None = None,
    encoding: ProgressCallback | None = None,
) -> ExportOutcome:
    """Export ``trace`` to the configured endpoint, or write it to the embedded file;
    ``encoding(spans encoded, spans)`` and ``progress(spans sent, spans)`` follow the two steps."""
    from ..otlp.export import export_spans, write_embedded

    folder = out_dir(directory).absolute()  # every path we print can be used from any folder
    name = f"fr-otel-trace-{trace.trace_id_hex}.jsonl"
    if config.disabled:
        return ExportOutcome("disabled", "nowhere (OTEL_SDK_DISABLED=true)", None, None)
    if config.endpoint is None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = write_embedded(trace.spans, folder, name, encoding=encoding)
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
        progress=progress,
        encoding=encoding,
    )
    if result.ok:
        return ExportOutcome("sent", result.endpoint, None, result)
    if result.spool_path:
        return ExportOutcome("spooled", result.endpoint, result.spool_path, result)
    if result.spans_rejected and not result.spans_lost:
        return ExportOutcome("partial", result.endpoint, None, result)
    return ExportOutcome("failed", result.endpoint, None, result)


def rejected_note(outcome: ExportOutcome, total: int) -> str:
    """``"the collector rejected 158 of 317 spans"`` when it did, else ``""`` (for every status line)."""
    result = outcome.result
    if result is None or not result.spans_rejected:
        return ""
    return f"the collector rejected {result.spans_rejected} of {total} spans"


_TLS_MISMATCH = re.compile(r"WRONG_VERSION_NUMBER|wrong version number|handshake failed|SSL_ERROR|TLS:", re.IGNORECASE)
_TRACES_PATH = "/v1/traces"


def export_hint(error: str | None, config: ExportConfig) -> str | None:
    """What to do about an export error the user can fix in their settings, or None.

    The wrong protocol for the port (gRPC to an OTLP/HTTP receiver or the reverse), a TLS
    handshake with a plaintext collector (add ``--insecure`` or write ``http://``), an
    OTLP/HTTP URL without ``/v1/traces`` (HTTP 404).
    """
    if not error:
        return None
    target = config.shown_target()
    netloc = urlsplit(target).netloc if "://" in target else target
    if NOT_HTTP in error:
        return (f"it looks like a gRPC receiver: use --protocol grpc --endpoint http://{netloc}, or the "
                f"collector's OTLP/HTTP port (usually 4318)")
    if NOT_GRPC in error:
        return (f"it looks like an OTLP/HTTP receiver: use --protocol http/protobuf --endpoint "
                f"http://{netloc}{_TRACES_PATH}, or the collector's gRPC port (usually 4317)")
    if _TLS_MISMATCH.search(error):
        if "://" not in target:
            return (f"the collector does not seem to speak TLS: add --insecure (or OTEL_EXPORTER_OTLP_INSECURE=true), "
                    f"or write the endpoint as http://{target}")
        if target.startswith("https://"):
            return f"the collector does not seem to speak TLS: write the endpoint as http://{target[len('https://'):]}"
        return None
    if config.protocol != "grpc" and re.search(r"\bHTTP 404\b", error):
        parts = urlsplit(target)
        base = f"{parts.scheme}://{parts.netloc}"
        if not parts.path.rstrip("/").endswith(_TRACES_PATH):
            return (f"nothing takes traces at {target}: OTLP/HTTP receivers listen on {_TRACES_PATH}; use "
                    f"--endpoint {base}{_TRACES_PATH} (or OTEL_EXPORTER_OTLP_ENDPOINT={base}, to which fr-otel "
                    f"appends {_TRACES_PATH})")
        return f"{target} answered 404: is {parts.netloc} an OTLP/HTTP receiver (usually port 4318)?"
    return None


def failure_reason(outcome: ExportOutcome, config: ExportConfig) -> str:
    """Why ``outcome`` did not deliver the trace, with what to do about it when we know."""
    why = outcome.result.error if outcome.result and outcome.result.error else outcome.destination
    hint = export_hint(why, config)
    return f"{why}; {hint}" if hint else why


def replay_command(path: str | os.PathLike[str], config: ExportConfig | None = None) -> str:
    """A complete ``fr-otel replay`` command line that sends ``path`` where ``config`` points
    (a placeholder collector when it points nowhere); see :func:`replay_command_line`."""
    if config is None:
        return replay_command_line(path)
    return replay_command_line(path, endpoint=config.endpoint, protocol=config.protocol, insecure=config.insecure,
                               header_names=config.headers or ())
