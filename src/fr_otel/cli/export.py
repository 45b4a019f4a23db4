"""``fr-otel export PATH`` (analyse, then one trace over OTLP or to a file) and ``fr-otel replay FILE``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from ..diagnosis.job import Job
from ..diagnosis.verdict import Verdict
from ..incident.delivery import (
    ExportOutcome,
    deliver_trace,
    export_hint,
    replay_command,
)
from ..incident.files import IncidentIdentity
from ..otlp.config import ExportConfig
from ..report.text import render_verdict
from ..trace.options import (
    DEFAULT_LAST_N,
    DEFAULT_MAX_SPANS,
    DEFAULT_SERVICE_NAME,
    TraceOptions,
)

if TYPE_CHECKING:  # the OpenTelemetry SDK and grpc load only when a command exports
    from ..trace.spans import IncidentTrace
from ._common import (
    EXIT_FAILED,
    EXIT_LOST,
    EXIT_NOT_DELIVERED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    EXIT_UNUSABLE,
    add_export_args,
    add_input_args,
    add_quiet_arg,
    analysed_incident,
    count,
    error,
    export_config,
    identity_env_ok,
    incident_key,
    job_id,
    outputs_ok,
    print_json,
    terminal_progress,
)
from .commands import command
from .report import add_html_arg, write_html

__all__ = [
    "add_trace_args", "describe_outcome", "export_and_report", "register", "run", "run_replay",
    "trace_options",
]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    this = command("export")
    parser = sub.add_parser(this.name, help=this.summary, description=this.description, epilog=EXIT_STATUS_HELP)
    add_input_args(parser)
    add_export_args(parser)
    add_trace_args(parser)
    parser.add_argument("--json", action="store_true", help="print verdict, trace id and export outcome as JSON")
    add_html_arg(parser)
    parser.set_defaults(func=run)
    replay = command("replay")
    replay_p = sub.add_parser(
        replay.name, help=replay.summary,
        description=f"{replay.description} Needs an endpoint (--endpoint or "
        "$OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT). Each span is delivered once: a delivered file is deleted (unless "
        "--keep), a partly delivered one keeps only what is left, so running it again finishes the job.",
    )
    replay_p.add_argument("files", nargs="+", metavar="FILE", help="fr-otel-trace-*.jsonl or fr-otel-spool-*.jsonl")
    add_export_args(replay_p, replay=True)
    replay_p.add_argument("--keep", action="store_true", help="keep delivered files (default: delete them)")
    add_quiet_arg(replay_p)
    replay_p.set_defaults(func=run_replay)


def add_trace_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-id", type=job_id, metavar="ID", help="job identity for trace ids (default: "
                        "$FR_OTEL_JOB_ID, the torchelastic or Slurm run id, else derived from the dumps)")
    parser.add_argument("--incident", type=incident_key, default="", metavar="KEY",
                        help="incident key, when one job has several (default: none)")
    parser.add_argument("--full", action="store_true", help="export every entry, not just the focus")
    parser.add_argument("--last-n", type=count, default=DEFAULT_LAST_N, metavar="N",
                        help="recent collectives per group per rank kept besides the focus (default: %(default)s)")
    parser.add_argument("--max-spans", type=count, default=DEFAULT_MAX_SPANS, metavar="N",
                        help="soft cap on spans in a focused trace (default: %(default)s)")
    parser.add_argument("--service-name", metavar="NAME", help="service.name (default: $OTEL_SERVICE_NAME, else "
                        f"{DEFAULT_SERVICE_NAME})")


def trace_options(args: argparse.Namespace, identity: IncidentIdentity | None = None) -> TraceOptions:
    """Flags first; then the live incident's identity (``incident.json``), so the trace id and
    the root span match the trace the agent sent; then the environment."""
    job_id, incident, root = args.job_id, args.incident, ()
    if identity is not None and not job_id:
        job_id, incident, root = identity.job_id, incident or identity.incident, identity.root_attributes
    return TraceOptions(
        job_id=job_id, incident=incident, full=args.full, last_n=args.last_n,
        max_spans=args.max_spans, service_name=args.service_name, root_attributes=root,
    )


def export_and_report(job: Job, verdict: Verdict, config: ExportConfig, args: argparse.Namespace,
                      identity: IncidentIdentity | None = None) -> int:
    """Build the trace, deliver it, print verdict + where it went; the exit code says if it arrived."""
    from ..trace.spans import build_trace

    bars = terminal_progress(args)
    with bars.task("building spans", "ranks") as update:
        trace = build_trace(job, verdict, trace_options(args, identity), progress=update)
    with bars.task("encoding spans", "spans") as encoded, bars.task("sending spans", "spans") as sent:
        outcome = deliver_trace(trace, config, directory=args.out, progress=sent, encoding=encoded)
    if getattr(args, "json", False):
        doc = verdict.to_dict(include_groups=False)
        doc["trace_id"] = trace.trace_id_hex
        doc["export"] = {"status": outcome.status, "destination": outcome.destination,
                         "path": str(outcome.path) if outcome.path else None, "spans": len(trace.spans),
                         "spans_rejected": outcome.result.spans_rejected if outcome.result else 0}
        print_json(doc)
    else:
        sys.stdout.write(render_verdict(verdict) + "\n")
    line = describe_outcome(outcome, trace, config)
    if getattr(args, "html", None):
        page = outcome.for_page(trace.trace_id_hex, len(trace.spans), config)
        if not write_html(args.html, job, verdict, trace=page) and outcome.ok:
            print(line, file=sys.stderr)
            return EXIT_FAILED
    if outcome.ok:
        print(line, file=sys.stderr if getattr(args, "json", False) else sys.stdout)
        return EXIT_OK
    error(line)
    return EXIT_LOST if outcome.lost else EXIT_NOT_DELIVERED


def describe_outcome(outcome: ExportOutcome, trace: IncidentTrace, config: ExportConfig) -> str:
    """The outcome's own sentence about the trace; where to find the trace when it arrived, or
    which export came up short when it did not."""
    line = f"trace {trace.trace_id_hex} ({len(trace.spans)} spans) {outcome.describe(len(trace.spans), config)}"
    if outcome.status in ("spooled", "failed") and outcome.result is not None:
        return f"export to {outcome.destination} incomplete: {line}"
    line = line[0].upper() + line[1:]
    if outcome.status == "file":
        return f"{line}\n  open it in Jaeger (Search > Upload JSON), or send it on: {replay_command(outcome.destination)}"
    if outcome.status == "sent":
        return f"{line}\n  find it in Tempo/Jaeger by trace id, or TraceQL: {{ span.fr_otel.verdict != nil }}"
    return line


def run(args: argparse.Namespace) -> int:
    if not outputs_ok(args) or not (args.job_id or identity_env_ok()):
        return EXIT_UNUSABLE
    config = export_config(args)
    if config is None:
        return EXIT_UNUSABLE
    analysed = analysed_incident(args)
    if analysed is None:
        return EXIT_UNUSABLE
    job, verdict, identity = analysed
    return export_and_report(job, verdict, config, args, identity)


def run_replay(args: argparse.Namespace) -> int:
    config = export_config(args)
    if config is None:
        return EXIT_UNUSABLE
    if config.endpoint is None:
        error("replay needs an endpoint: --endpoint or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT")
        return EXIT_UNUSABLE
    from ..otlp.export import replay

    for name in args.files:
        if not os.path.isfile(name):
            error(f"{name}: {'no such file' if not os.path.lexists(name) else 'not a regular file'}")
            return EXIT_UNUSABLE
    with terminal_progress(args).task("sending spans", "spans") as update:
        result = replay(args.files, config, deadline_s=config.timeout_s, remove_on_success=not args.keep,
                        progress=update)
    if result.ok:
        print(f"fr-otel: replayed {result.spans_sent} spans to {result.endpoint}")
        return EXIT_OK
    hint = export_hint(result.error, config)
    rejected = f", {result.spans_rejected} rejected by the collector" if result.spans_rejected else ""
    error(f"replay to {result.endpoint} incomplete: {result.spans_sent} spans sent{rejected}, {result.spans_spooled} "
          f"still in their files ({result.error}){'; ' + hint if hint else ''}")
    return EXIT_NOT_DELIVERED
