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
    incident_from_args,
    outputs_ok,
)
from .commands import command
from .report import add_html_arg, write_html

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    this = command("analyze")
    parser = sub.add_parser(this.name, help=this.summary, description=this.description)
    add_input_args(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object (the public schema)")
    add_html_arg(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not outputs_ok(args):
        return EXIT_UNUSABLE
    incident = incident_from_args(args)
    if incident is None:
        return EXIT_UNUSABLE
    identity = incident.identity
    if args.json:
        sys.stdout.write(incident.to_json() + "\n")
    else:
        sys.stdout.write(render_verdict(incident.verdict))
        if identity is not None:
            sys.stdout.write(f"\nLive incident {identity.incident} of job {identity.job_id}: trace {identity.trace_id}\n")
    if args.html and not write_html(args.html, incident.job, incident.verdict, trace=incident.trace_delivery()):
        return EXIT_FAILED
    return EXIT_OK
