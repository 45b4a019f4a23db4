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
from .analysis import AnalysisOptions, Verdict, analyze
from .job import build_job
from .reader import read_dumps
from .text_report import render_verdict

__all__ = ["main", "EXIT_OK", "EXIT_UNUSABLE"]

EXIT_OK = 0  # analysed, whatever the verdict
EXIT_UNUSABLE = 2  # no usable dump or bad usage


def _add_input_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a directory of per-rank dumps, or dump files")
    parser.add_argument("--prefix", help="dump file name prefix; the rest of the name is the rank")
    parser.add_argument(
        "--straggler-threshold", type=float, default=AnalysisOptions.straggler_threshold_s, metavar="SECONDS",
        help="median enqueue lateness that makes a straggler (default: %(default)s)",
    )
    parser.add_argument("--workers", type=int, default=None, help="processes to read dumps with (default: all cores)")


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
    demo_p = sub.add_parser("demo", help="run a real 4-rank gloo job on CPU in which one rank hangs, and analyse it")
    demo_p.add_argument("--out", default="fr-otel-out/demo", help="where the dumps go (default: %(default)s)")
    demo_p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    return parser


def load_and_analyze(paths: Sequence[str], prefix: str | None, options: AnalysisOptions, workers: int | None) -> Verdict | None:
    """Read, model and analyse; None when not a single dump could be read."""
    read = read_dumps(paths, prefix=prefix, workers=workers)
    if not read.dumps:
        for line in read.problems:
            print(f"fr-otel: {line}", file=sys.stderr)
        print("fr-otel: no usable Flight Recorder dump", file=sys.stderr)
        return None
    return analyze(build_job(read), options)


def _cmd_analyze(args: argparse.Namespace) -> int:
    options = AnalysisOptions(straggler_threshold_s=args.straggler_threshold)
    verdict = load_and_analyze(args.paths, args.prefix, options, args.workers)
    if verdict is None:
        return EXIT_UNUSABLE
    if args.json:
        json.dump(verdict.to_dict(), sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_verdict(verdict))
    return EXIT_OK


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
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    parser.error(f"unknown command {args.command}")
    return EXIT_UNUSABLE


if __name__ == "__main__":
    sys.exit(main())
