"""``fr-otel analyze PATH``: the verdict, culprits and evidence."""

from __future__ import annotations

import argparse
import sys

from ..analysis import analyze
from ..text_report import render_verdict
from ._common import (
    EXIT_FAILED, EXIT_OK, EXIT_UNUSABLE, add_input_args, analysis_options, load_job, print_json, terminal_progress,
)
from .report import add_html_arg, write_html


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    summary = "name the culprit ranks of a hang, with evidence"
    parser = sub.add_parser("analyze", help=summary, description=f"{summary[0].upper()}{summary[1:]}.")
    add_input_args(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object (the public schema)")
    add_html_arg(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    job = load_job(args.paths, args.prefix, args.workers, terminal_progress(args))
    if job is None:
        return EXIT_UNUSABLE
    verdict = analyze(job, analysis_options(args))
    if args.json:
        print_json(verdict.to_dict())
    else:
        sys.stdout.write(render_verdict(verdict))
    if args.html and not write_html(args.html, job, verdict):
        return EXIT_FAILED
    return EXIT_OK
