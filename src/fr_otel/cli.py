"""The ``fr-otel`` command line: argument parsing and exit codes only.

Each subcommand turns flags into plain arguments for the library and prints
what the library returns; no analysis happens here.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from . import __version__
from .analysis import DEFAULT_STRAGGLER_THRESHOLD_S, AnalysisOptions, analyze
from .incident_export import DEFAULT_OUT_DIR, OUT_DIR_ENV, ExportOutcome, deliver_trace
from .job import Job, build_job
from .otlp_config import ExportConfig, resolve_export_config
from .otlp_export import replay
from .reader import read_dumps
from .spans import DEFAULT_LAST_N, DEFAULT_MAX_SPANS, DEFAULT_SERVICE_NAME, IncidentTrace, TraceOptions, build_trace
from .text_report import render_verdict

__all__ = ["main", "EXIT_OK", "EXIT_UNUSABLE", "EXIT_NOT_DELIVERED"]

EXIT_OK = 0  # analysed, whatever the verdict
EXIT_UNUSABLE = 2  # no usable dump or bad usage
EXIT_NOT_DELIVERED = 3  # analysed, but the trace is spooled (collector down or refusing), not delivered


def _add_input_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a directory of per-rank dumps, or dump files")
    parser.add_argument("--prefix", help="dump file name prefix; the rest of the name is the rank")
    parser.add_argument(
        "--straggler-threshold", type=float, default=DEFAULT_STRAGGLER_THRESHOLD_S, metavar="SECONDS",
        help="median enqueue lateness that makes a straggler (default: %(default)s)",
    )
    parser.add_argument("--workers", type=int, default=None, help="processes to read dumps with (default: all cores)")


def _add_export_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", help="OTLP endpoint (default: $OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT; none: "
                        "write a local OTLP JSON Lines file)")
    parser.add_argument("--protocol", choices=("grpc", "http/protobuf"),
                        help="default: $OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL, else grpc")
    parser.add_argument("--headers", help="k=v,k2=v2 (default: $OTEL_EXPORTER_OTLP_[TRACES_]HEADERS)")
    parser.add_argument("--timeout", type=float, help="seconds for the whole export, retries included "
                        "(default: $OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT, else 10)")
    parser.add_argument("--insecure", action="store_true", default=None, help="plaintext gRPC to a host:port endpoint")
    parser.add_argument("--out", help=f"folder for the embedded file and spools (default: ${OUT_DIR_ENV}, else "
                        f"./{DEFAULT_OUT_DIR})")


def _export_config(args: argparse.Namespace) -> ExportConfig | None:
    try:
        return resolve_export_config(
            protocol=args.protocol, endpoint=args.endpoint, headers=args.headers, timeout_s=args.timeout,
            insecure=args.insecure,
        )
    except ValueError as exc:
        print(f"fr-otel: {exc}", file=sys.stderr)
        return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fr-otel",
        description="Make hangs in distributed PyTorch training obvious: analyse Flight Recorder dumps.",
    )
    parser.add_argument("--version", action="version", version=f"fr-otel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    analyze_p = sub.add_parser("analyze", help="name the culprit ranks of a hang, with evidence")
    _add_input_args(analyze_p)
    analyze_p.add_argument("--json", action="store_true", help="print one JSON object (the public schema)")
    export_p = sub.add_parser(
        "export", help="analyse and export the incident as one OpenTelemetry trace (OTLP, or a local file)"
    )
    _add_input_args(export_p)
    _add_export_args(export_p)
    export_p.add_argument("--job-id", help="job identity for trace ids (default: $FR_OTEL_JOB_ID, torchelastic or "
                          "Slurm run id, else derived from the dumps)")
    export_p.add_argument("--incident", default="", help="incident key, when one job has several (default: none)")
    export_p.add_argument("--full", action="store_true", help="export every entry, not just the focus")
    export_p.add_argument("--last-n", type=int, default=DEFAULT_LAST_N, metavar="N",
                          help="recent collectives per group per rank kept besides the focus (default: %(default)s)")
    export_p.add_argument("--max-spans", type=int, default=DEFAULT_MAX_SPANS,
                          help="soft cap on spans in a focused trace (default: %(default)s)")
    export_p.add_argument("--service-name", help="service.name (default: $OTEL_SERVICE_NAME, else "
                          f"{DEFAULT_SERVICE_NAME})")
    export_p.add_argument("--json", action="store_true", help="print verdict and export outcome as JSON")
    replay_p = sub.add_parser("replay", help="send OTLP JSON Lines files (embedded output or spool) to an endpoint")
    replay_p.add_argument("files", nargs="+", metavar="FILE")
    _add_export_args(replay_p)
    replay_p.add_argument("--keep", action="store_true", help="keep delivered files (default: delete them)")
    demo_p = sub.add_parser("demo", help="run a real 4-rank gloo job on CPU in which one rank hangs, and analyse it")
    demo_p.add_argument("--out", default="fr-otel-out/demo", help="where the dumps go (default: %(default)s)")
    demo_p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    return parser


def load(paths: Sequence[str], prefix: str | None, workers: int | None) -> tuple[Job] | None:
    """Read and model the dumps; None (after saying why) when not a single dump could be read."""
    read = read_dumps(paths, prefix=prefix, workers=workers)
    if not read.dumps:
        for line in read.problems:
            print(f"fr-otel: {line}", file=sys.stderr)
        print("fr-otel: no usable Flight Recorder dump", file=sys.stderr)
        return None
    return (build_job(read),)


def _cmd_analyze(args: argparse.Namespace) -> int:
    options = AnalysisOptions(straggler_threshold_s=args.straggler_threshold)
    loaded = load(args.paths, args.prefix, args.workers)
    if loaded is None:
        return EXIT_UNUSABLE
    verdict = analyze(loaded[0], options)
    if args.json:
        json.dump(verdict.to_dict(), sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_verdict(verdict))
    return EXIT_OK


def _describe_outcome(outcome: ExportOutcome, trace: IncidentTrace) -> str:
    if outcome.status == "file":
        return (f"Trace {trace.trace_id_hex} ({len(trace.spans)} spans) written to {outcome.destination}\n"
                f"  open it in Jaeger (Search > JSON File), or send it later: fr-otel replay {outcome.destination} "
                "--endpoint URL")
    if outcome.status == "sent":
        return (f"Trace {trace.trace_id_hex} ({len(trace.spans)} spans) sent to {outcome.destination}\n"
                f"  Tempo/Grafana: {{ span.fr_otel.verdict != \"\" }} or trace id {trace.trace_id_hex}")
    if outcome.status == "disabled":
        return f"Trace {trace.trace_id_hex} not exported: OTEL_SDK_DISABLED=true"
    error = outcome.result.error if outcome.result else outcome.destination
    if outcome.path:
        return (f"fr-otel: export to {outcome.destination} incomplete ({error}); "
                f"spooled to {outcome.path}: fr-otel replay {outcome.path}")
    return f"fr-otel: export of trace {trace.trace_id_hex} failed: {error}"


def _cmd_export(args: argparse.Namespace) -> int:
    config = _export_config(args)
    if config is None:
        return EXIT_UNUSABLE
    options = AnalysisOptions(straggler_threshold_s=args.straggler_threshold)
    loaded = load(args.paths, args.prefix, args.workers)
    if loaded is None:
        return EXIT_UNUSABLE
    job, verdict = loaded[0], analyze(loaded[0], options)
    trace = build_trace(job, verdict, TraceOptions(
        job_id=args.job_id, incident=args.incident, full=args.full, last_n=args.last_n,
        max_spans=args.max_spans, service_name=args.service_name,
    ))
    outcome = deliver_trace(trace, config, directory=args.out)
    if args.json:
        doc = verdict.to_dict(include_groups=False)
        doc["trace_id"] = trace.trace_id_hex
        doc["export"] = {"status": outcome.status, "destination": outcome.destination,
                         "path": str(outcome.path) if outcome.path else None, "spans": len(trace.spans)}
        json.dump(doc, sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_verdict(verdict))
        print()
    line = _describe_outcome(outcome, trace)
    print(line, file=sys.stdout if outcome.ok and not args.json else sys.stderr)
    return EXIT_OK if outcome.ok else EXIT_NOT_DELIVERED


def _cmd_replay(args: argparse.Namespace) -> int:
    config = _export_config(args)
    if config is None:
        return EXIT_UNUSABLE
    if config.endpoint is None:
        print("fr-otel: replay needs an endpoint: --endpoint or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT", file=sys.stderr)
        return EXIT_UNUSABLE
    result = replay(args.files, config, deadline_s=config.timeout_s, remove_on_success=not args.keep)
    if result.ok:
        print(f"fr-otel: replayed {result.spans_sent} spans to {result.endpoint}")
        return EXIT_OK
    print(f"fr-otel: replay to {result.endpoint} incomplete: {result.spans_sent} spans sent, "
          f"{result.spans_spooled} still in their files ({result.error})", file=sys.stderr)
    return EXIT_NOT_DELIVERED


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import TorchMissing, run_demo

    print("fr-otel demo: running a real 4-rank gloo job in which rank 2 skips an all_reduce...", file=sys.stderr)
    try:
        result = run_demo(args.out)
    except TorchMissing as exc:
        print(f"fr-otel: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except RuntimeError as exc:
        print(f"fr-otel: the demo job failed: {str(exc).splitlines()[0] if str(exc) else exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(result.verdict.to_dict(), sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_verdict(result.verdict))
        print(f"\nDumps (one per rank): {result.dumps_dir}")
        print(f"Analyse them again: fr-otel analyze {result.dumps_dir}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fr-otel`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "analyze":
            return _cmd_analyze(args)
        if args.command == "demo":
            return _cmd_demo(args)
        if args.command == "export":
            return _cmd_export(args)
        if args.command == "replay":
            return _cmd_replay(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    parser.error(f"unknown command {args.command}")
    return EXIT_UNUSABLE


if __name__ == "__main__":
    sys.exit(main())
