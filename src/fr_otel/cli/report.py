"""``fr-otel report PATH -o incident.html``: the incident as one self-contained HTML page.

Also home of ``--html FILE`` for ``analyze`` and ``export`` (:func:`add_html_arg`,
:func:`write_html`): the same page, written beside their usual output.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from ..diagnosis.job import Job
from ..diagnosis.verdict import Verdict
from ..report.text import verdict_line
from ._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNUSABLE,
    add_input_args,
    error,
    incident_from_args,
    outputs_ok,
)
from .commands import command

if TYPE_CHECKING:
    from ..report.trace_section import TraceDelivery

__all__ = ["DEFAULT_OUTPUT", "add_html_arg", "register", "run", "write_html"]

DEFAULT_OUTPUT = "incident.html"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    this = command("report")
    parser = sub.add_parser(this.name, help=this.summary, description=this.description)
    add_input_args(parser)
    parser.add_argument("-o", "--output", default=DEFAULT_OUTPUT, metavar="FILE",
                        help="where the page goes; '-' for stdout (default: %(default)s)")
    parser.set_defaults(func=run)


def add_html_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--html", metavar="FILE",
                        help="also write the incident as a self-contained HTML page to FILE (see fr-otel report; "
                        "default: none)")


def write_html(path: str, job: Job, verdict: Verdict, *, trace: TraceDelivery | None = None) -> bool:
    """Render and write the page; one line on stderr says where (or why not)."""
    from ..report.html import (  # the renderer loads only when a page is asked for
        render,
        write_report,
    )

    document = render(job, verdict, trace=trace)
    try:
        size = write_report(path, document, follow_links=True)  # -o/--html: the user named this path
    except OSError as exc:
        error(f"cannot write the HTML report {path}: {exc.strerror or exc}")
        return False
    print(f"fr-otel: HTML report written to {os.path.abspath(path)} ({size / 1024:.0f} KiB)", file=sys.stderr)
    return True


def run(args: argparse.Namespace) -> int:
    if not outputs_ok(args):
        return EXIT_UNUSABLE
    incident = incident_from_args(args)
    if incident is None:
        return EXIT_UNUSABLE
    job, verdict, trace = incident.job, incident.verdict, incident.trace_delivery()
    if args.output == "-":
        from ..report.html import render

        sys.stdout.write(render(job, verdict, trace=trace))
        return EXIT_OK
    if not write_html(args.output, job, verdict, trace=trace):
        return EXIT_FAILED
    print(f"{verdict_line(verdict)}\nopen it: {os.path.abspath(args.output)}")
    return EXIT_OK
