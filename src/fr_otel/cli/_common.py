"""What several subcommands share: input and export flags, loading dumps (and the exit codes, from
:mod:`.exit_codes`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from ..common.files import OutputRefused, check_output_dir, check_output_file
from ..common.names import identity_problem
from ..common.progress import TerminalProgress
from ..common.text import printable
from ..diagnosis.verdict import DEFAULT_STRAGGLER_THRESHOLD_S
from ..incident.pipeline import IncidentResult, NoUsableDump, analyze_incident
from ..read.safe_pickle import DEFAULT_MAX_FILE_BYTES
from .exit_codes import (
    EXIT_FAILED,
    EXIT_LOST,
    EXIT_NOT_DELIVERED,
    EXIT_OK,
    EXIT_STATUS_HELP,
    EXIT_UNUSABLE,
)

if TYPE_CHECKING:  # the export's modules load only for the commands that export (not `analyze`)
    from ..incident.sinks import IncidentSink
    from ..otlp.config import ExportConfig
    from ..trace.options import TraceOptions

__all__ = [
    "EXIT_FAILED", "EXIT_LOST", "EXIT_NOT_DELIVERED", "EXIT_OK", "EXIT_STATUS_HELP", "EXIT_UNUSABLE",
    "add_export_args", "add_input_args", "add_quiet_arg", "byte_size", "count", "error",
    "export_config", "identity_env_ok", "incident_from_args", "incident_key", "job_id", "non_negative_seconds",
    "outputs_ok", "print_json", "seconds", "terminal_progress",
]

def error(message: str) -> None:
    """One printable line on stderr (file names and dump text may hold control characters)."""
    print(f"fr-otel: {printable(message)}", file=sys.stderr)


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def byte_size(text: str) -> int:
    """``1073741824``, ``512M``, ``1G``, ``2GiB`` -> bytes (argparse type)."""
    value = text.strip().lower().removesuffix("ib").removesuffix("b")
    number, unit = (value[:-1], value[-1]) if value[-1:] in _UNITS and value[-1:] else (value, "")
    try:
        size = int(float(number) * _UNITS[unit])
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"not a size in bytes (e.g. 512M, 1G): {text!r}") from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte: {text!r}")
    return size


_N = TypeVar("_N", int, float)


def _number(text: str, parse: Callable[[str], _N], ok: Callable[[_N], bool], want: str) -> _N:
    """``parse(text)`` if it gives a finite value that is ``ok``, else a usage error naming ``want``."""
    try:
        value = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
    return value


def count(text: str) -> int:
    """A whole number >= 1 (argparse type): -5 workers or spans is a usage error, not a surprise."""
    return _number(text, int, lambda v: v >= 1, "a whole number >= 1")


def seconds(text: str) -> float:
    """A finite number of seconds > 0 (argparse type): nan, inf and -1 are usage errors."""
    return _number(text, float, lambda v: v > 0, "a positive, finite number of seconds")


def non_negative_seconds(text: str) -> float:
    """A finite number of seconds >= 0 (argparse type; 0 = at once)."""
    return _number(text, float, lambda v: v >= 0, "a finite number of seconds >= 0")


def job_id(text: str) -> str:
    """A job id (argparse type): printable, at most 256 characters (it goes into trace ids,
    resource attributes and on the terminal)."""
    return _identity(text, "job id")


def incident_key(text: str) -> str:
    """An incident key (argparse type), by the same rule as a job id."""
    return _identity(text, "incident key")


def _identity(text: str, what: str) -> str:
    why = identity_problem(text, what)
    if why:
        raise argparse.ArgumentTypeError(f"{why}: {printable(text)[:80]!r}")
    return text


def identity_env_ok() -> bool:
    """$FR_OTEL_JOB_ID (and the launchers' run ids) must be identities when they are what an
    export would use: a bad one is one line (exit 2), as a bad OTEL_* variable is."""
    from ..trace.ids import job_identity

    problems: list[str] = []
    job_identity(None, problems=problems)
    for line in problems:
        error(line)
    return not problems


def add_input_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a directory of per-rank dumps, or dump files")
    parser.add_argument("--prefix", metavar="NAME",
                        help="dump file name prefix; the rest of the name is the rank (default: any name ending in a "
                        "rank number)")
    parser.add_argument(
        "--straggler-threshold", type=seconds, default=DEFAULT_STRAGGLER_THRESHOLD_S, metavar="SECONDS",
        help="enqueue lateness (median, or mean when bursty) that makes a straggler (default: %(default)s)",
    )
    parser.add_argument("--workers", type=count, default=None, metavar="N",
                        help="processes to read dumps with (default: every CPU this process may run on)")
    parser.add_argument("--max-file-size", type=byte_size, default=DEFAULT_MAX_FILE_BYTES, metavar="BYTES",
                        help="refuse dump files larger than this, e.g. 512M, 4G (default: 1G)")
    add_quiet_arg(parser)


def add_quiet_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bar (shown on a terminal only, for work that takes over a second)")


def outputs_ok(args: argparse.Namespace) -> bool:
    """-o/--html must be regular files (or new), --out a folder (or new); else say why (exit 2, nothing touched)."""
    try:
        for name in ("output", "html"):
            value = getattr(args, name, None)
            if value and value != "-":
                check_output_file(value)
        if getattr(args, "out", None):
            check_output_dir(args.out)
    except OutputRefused as exc:
        error(str(exc))
        return False
    return True


def terminal_progress(args: argparse.Namespace) -> TerminalProgress:
    """Progress bars on stderr when it is a terminal, unless ``--quiet``."""
    return TerminalProgress(enabled=False if getattr(args, "quiet", False) else None)


def incident_from_args(args: argparse.Namespace, *, trace: TraceOptions | None = None,
                       sink: IncidentSink | None = None) -> IncidentResult | None:
    """The dumps (and side files) named on the command line through the incident pipeline with the
    command's options: analysed, and with ``trace``/``sink`` traced and delivered. None (after
    saying why) when not a single dump could be read."""
    try:
        return analyze_incident(args.paths, prefix=args.prefix, straggler_threshold_s=args.straggler_threshold,
                                workers=args.workers, max_file_bytes=args.max_file_size, trace=trace, sink=sink,
                                progress=terminal_progress(args))
    except NoUsableDump as exc:
        for line in exc.problems:
            error(line)
        error(str(exc))
        return None


def add_export_args(parser: argparse.ArgumentParser, *, replay: bool = False, out: bool = True) -> None:
    """The OTLP flags, one set for every command that exports (``replay``: it needs an endpoint;
    ``out=False``: the command says itself where its files go)."""
    from ..incident.delivery import DEFAULT_OUT_DIR, OUT_DIR_ENV
    from ..otlp.config import DEFAULT_TIMEOUT_S, PROTOCOLS

    where = ("required, here or in the variable" if replay else "none: write a local OTLP JSON Lines file")
    parser.add_argument("--endpoint", metavar="URL", help="OTLP endpoint: http://HOST:4317 (gRPC, plaintext), "
                        "https://HOST:4317, or http(s)://HOST:4318/v1/traces for OTLP/HTTP (default: "
                        f"$OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT; {where})")
    parser.add_argument("--protocol", choices=PROTOCOLS, metavar="{" + ",".join(PROTOCOLS) + "}",
                        help="default: $OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL, else grpc")
    parser.add_argument("--headers", metavar="K=V[,K=V]",
                        help="request headers, e.g. authorization=Bearer%%20x (default: "
                        "$OTEL_EXPORTER_OTLP_[TRACES_]HEADERS)")
    parser.add_argument("--timeout", type=seconds, metavar="SECONDS", help="seconds for the whole export, retries "
                        f"included (default: $OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT, else {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="plaintext gRPC to a HOST:PORT endpoint written without http:// (default: "
                        "$OTEL_EXPORTER_OTLP_[TRACES_]INSECURE, else TLS)")
    if out and not replay:
        parser.add_argument("--out", metavar="DIR", help=f"folder for the embedded file and spools (default: "
                            f"${OUT_DIR_ENV}, else ./{DEFAULT_OUT_DIR})")


def export_config(args: argparse.Namespace) -> ExportConfig | None:
    """Flags over the standard OTEL_* variables; None (after saying why) on a bad flag or setting.
    A bad inherited timeout or insecure variable is a warning and its default is used."""
    from ..otlp.config import resolve_export_config
    from ..otlp.tls_files import check_tls_files

    warnings: list[str] = []
    try:
        config = resolve_export_config(
            protocol=args.protocol, endpoint=args.endpoint, headers=args.headers, timeout_s=args.timeout,
            insecure=args.insecure, warnings=warnings,
        )
        check_tls_files(config)
    except ValueError as exc:
        error(str(exc))
        return None
    for line in warnings:
        error(line)
    return config


def print_json(doc: dict[str, Any]) -> None:
    json.dump(doc, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")
