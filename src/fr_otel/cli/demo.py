"""``fr-otel demo``: the main job — a real gloo hang on CPU, analysed and exported."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..demo import TorchMissing, run_demo
from ..incident.pipeline import IncidentPlan, evidence_from_files, run_incident
from ..incident.sinks import sink_for
from ._common import (
    EXIT_FAILED,
    EXIT_UNUSABLE,
    add_export_args,
    error,
    export_config,
    terminal_progress,
)
from .commands import command
from .export import add_trace_args, report_delivery, trace_options

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    this = command("demo")
    parser = sub.add_parser(this.name, help=this.summary, description=this.description)
    parser.add_argument("--dumps", default="fr-otel-out/demo", metavar="DIR",
                        help="where the dumps go (default: %(default)s)")
    parser.add_argument("--html", metavar="FILE",
                        help="the self-contained HTML report (default: DUMPS/incident.html; '' for none)")
    add_export_args(parser)
    add_trace_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = export_config(args)
    if config is None:
        return EXIT_UNUSABLE
    print("fr-otel demo: a real 4-rank gloo job on CPU; rank 2 skips an all_reduce, the others hang in it...",
          file=sys.stderr)
    try:
        dumps_dir = run_demo(args.dumps)
    except TorchMissing as exc:
        error(str(exc))
        return EXIT_UNUSABLE
    except RuntimeError as exc:
        error(f"the demo job failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        return EXIT_FAILED
    if args.html is None:
        args.html = str(Path(args.dumps) / "incident.html")
    progress = terminal_progress(args)
    incident = run_incident(evidence_from_files(dumps_dir, progress=progress),
                            IncidentPlan(trace=trace_options(args), sink=sink_for(config, args.out), progress=progress))
    code = report_delivery(incident, config, args)
    print(f"Dumps (one per rank): {dumps_dir}\n  analyse them again: fr-otel analyze {dumps_dir}")
    return code
