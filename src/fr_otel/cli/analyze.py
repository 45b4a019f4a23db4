"""``fr-otel analyze PATH``: the verdict, culprits and evidence."""

from __future__ import annotations

import argparse
import sys

from ..report.text import render_verdict
from ._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNUSABLE,
    add_input_args,
    analysed_incident,
    outputs_ok,
    print_json,
)
from .commands import command
from .report import add_html_arg, write_html

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    this = command("analyze")
    parser = sub.add_parser(this.name, help=this.summary, description=this.description)
    add_input_args(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object (the public schema)")
    add_html_arg(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not outputs_ok(args):
        return EXIT_UNUSABLE
    analysed = analysed_incident(args)
    if analysed is None:
        return EXIT_UNUSABLE
    job, verdict, identity = analysed
    trace_id = identity.trace_id if identity is not None else None
    if args.json:
        doc = verdict.to_dict()
        if trace_id:
            doc["trace_id"] = trace_id  # the live incident's, from incident.json
        print_json(doc)
    else:
        sys.stdout.write(render_verdict(verdict))
        if trace_id:
            sys.stdout.write(f"\nLive incident {identity.incident} of job {identity.job_id}: trace {trace_id}\n")
    page = identity.trace_delivery() if identity is not None else None
    if args.html and not write_html(args.html, job, verdict, trace=page):
        return EXIT_FAILED
    return EXIT_OK
