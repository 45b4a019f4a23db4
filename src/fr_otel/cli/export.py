"""``fr-otel export PATH`` (analyse, then one trace over OTLP or to a file) and ``fr-otel replay FILE``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from ..common.export_status import ExportStatus
from ..incident.delivery import ExportOutcome, export_fix, replay_command
from ..incident.pipeline import IncidentResult
from ..incident.sinks import sink_for
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
    count,
    error,
    export_config,
    identity_env_ok,
    incident_from_args,
    incident_key,
    job_id,
    outputs_ok,
    print_json,
    terminal_progress,
)
from .commands import command
from .report import add_html_arg, write_html

__all__ = [
    "add_trace_args", "describe_outcome", "register", "report_delivery", "run", "run_replay", "trace_options",
]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def trace_options(args: argparse.Namespace) -> TraceOptions:
    """The trace flags; where they name no job, the live incident's identity (``incident.json``)
    gives the trace id and root attributes (:mod:`fr_otel.incident.pipeline`), then the environment."""
    return TraceOptions(
        job_id=args.job_id, incident=args.incident, full=args.full, last_n=args.last_n,
        max_spans=args.max_spans, service_name=args.service_name,
    )


def report_delivery(incident: IncidentResult, config: ExportConfig, args: argparse.Namespace) -> int:
    """Print the verdict and where the trace went; the exit code says if it arrived."""
    trace, outcome = incident.trace, incident.outcome
    assert trace is not None and outcome is not None
    if getattr(args, "json", False):
        print_json(incident.to_dict(include_groups=False))
    else:
        sys.stdout.write(render_verdict(incident.verdict) + "\n")
    line = describe_outcome(outcome, trace, config)
    if getattr(args, "html", None):
        page = incident.trace_delivery(config)
        if not write_html(args.html, incident.job, incident.verdict, trace=page) and outcome.ok:
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
    if outcome.status in (ExportStatus.SPOOLED, ExportStatus.FAILED) and outcome.result is not None:
        return f"export to {outcome.destination} incomplete: {line}"
    line = line[0].upper() + line[1:]
    if outcome.status == ExportStatus.FILE:
        return f"{line}\n  open it in Jaeger (Search > Upload JSON), or send it on: {replay_command(outcome.destination)}"
    if outcome.status == ExportStatus.SENT:
        return f"{line}\n  find it in Tempo/Jaeger by trace id, or TraceQL: {{ span.fr_otel.verdict != nil }}"
    return line


def run(args: argparse.Namespace) -> int:
    if not outputs_ok(args) or not (args.job_id or identity_env_ok()):
        return EXIT_UNUSABLE
    config = export_config(args)
    if config is None:
        return EXIT_UNUSABLE
    incident = incident_from_args(args, trace=trace_options(args), sink=sink_for(config, args.out))
    if incident is None:
        return EXIT_UNUSABLE
    return report_delivery(incident, config, args)


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
    fix = export_fix(result.error, config)
    hint = f"; {fix.hint}" if fix is not None else ""
    left = [name for name in args.files if os.path.isfile(name)]
    if fix is not None and left and (fix.endpoint or fix.protocol or fix.insecure):
        hint += f"; run: {replay_command(left, config, fix)}"  # the command that finishes the job
    rejected = f", {result.spans_rejected} rejected by the collector" if result.spans_rejected else ""
    error(f"replay to {result.endpoint} incomplete: {result.spans_sent} spans sent{rejected}, {result.spans_spooled} "
          f"still in their files ({result.error}){hint}")
    return EXIT_NOT_DELIVERED
