"""What several subcommands share: exit codes, input and export flags, loading dumps."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from ..analysis import DEFAULT_STRAGGLER_THRESHOLD_S, AnalysisOptions
from ..incident_export import DEFAULT_OUT_DIR, OUT_DIR_ENV
from ..job import Job, build_job
from ..otlp_config import ExportConfig, resolve_export_config
from ..reader import read_dumps

EXIT_OK = 0  # analysed, whatever the verdict
EXIT_FAILED = 1  # the command could not do its job (e.g. the demo's torch job failed)
EXIT_UNUSABLE = 2  # no usable dump, bad configuration or bad usage
EXIT_NOT_DELIVERED = 3  # analysed, but the trace is spooled (collector down or refusing), not delivered


def error(message: str) -> None:
    """One line on stderr, prefixed like every fr-otel message."""
    print(f"fr-otel: {message}", file=sys.stderr)


def add_input_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a directory of per-rank dumps, or dump files")
    parser.add_argument("--prefix", help="dump file name prefix; the rest of the name is the rank")
    parser.add_argument(
        "--straggler-threshold", type=float, default=DEFAULT_STRAGGLER_THRESHOLD_S, metavar="SECONDS",
        help="median enqueue lateness that makes a straggler (default: %(default)s)",
    )
    parser.add_argument("--workers", type=int, default=None, help="processes to read dumps with (default: all cores)")


def analysis_options(args: argparse.Namespace) -> AnalysisOptions:
    return AnalysisOptions(straggler_threshold_s=args.straggler_threshold)


def load_job(paths: Sequence[str], prefix: str | None, workers: int | None) -> Job | None:
    """Read and model the dumps; None (after saying why) when not a single dump could be read."""
    read = read_dumps(paths, prefix=prefix, workers=workers)
    if not read.dumps:
        for line in read.problems:
            error(line)
        error("no usable Flight Recorder dump")
        return None
    return build_job(read)


def add_export_args(parser: argparse.ArgumentParser) -> None:
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


def export_config(args: argparse.Namespace) -> ExportConfig | None:
    """Flags over the standard OTEL_* variables; None (after saying why) on a bad value."""
    try:
        return resolve_export_config(
            protocol=args.protocol, endpoint=args.endpoint, headers=args.headers, timeout_s=args.timeout,
            insecure=args.insecure,
        )
    except ValueError as exc:
        error(str(exc))
        return None


def print_json(doc: dict[str, Any]) -> None:
    json.dump(doc, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")
