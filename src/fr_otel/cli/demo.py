"""``fr-otel demo``: the live path in one command — a real gloo job under ``fr-otel run`` whose
rank 2 stalls in its data loader; the agent's verdict, the culprit in ``/metrics``, the trace,
the report and the offline re-analysis, then the job stopped."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from ..demo import (
    DemoFailed,
    DemoJob,
    DemoPlan,
    Findings,
    TorchMissing,
    intro,
    metrics_base,
    render,
    scrape,
)
from ..otlp.config import (
    OTEL_EXPORTER_OTLP_TRACES_HEADERS,
    OTEL_EXPORTER_OTLP_TRACES_INSECURE,
    OTEL_EXPORTER_OTLP_TRACES_TIMEOUT,
)
from ..read.incident_file import INCIDENT_FILE, read_identity
from ._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNUSABLE,
    add_export_args,
    error,
    export_config,
)
from .commands import command

__all__ = ["register", "run"]

DEFAULT_OUT = "fr-otel-out/demo"
WORLD_SIZE = 4


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    this = command("demo")
    parser = sub.add_parser(this.name, help=this.summary, description=this.description)
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help="the job's files: dumps/<trace id>/ (dumps, incident.json, incident.html, ranks.json, "
                        "steps.json), the trace file when no endpoint is set, job.log (default: %(default)s)")
    parser.add_argument("--metrics-port", type=_port, metavar="PORT",
                        help="base port of the ranks' /metrics on 127.0.0.1 (rank r serves PORT + r; default: 9740, "
                        "or a free block when that one is taken)")
    add_export_args(parser, out=False)
    parser.set_defaults(func=run)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= port <= 65536 - WORLD_SIZE:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to {65536 - WORLD_SIZE}, got {port}")
    return port


def _export_settings(args: argparse.Namespace) -> tuple[tuple[str, ...], dict[str, str]]:
    """The export flags as the job takes them: ``fr-otel run`` flags, and the standard variables
    for the settings it has no flag for."""
    flags: list[str] = []
    if args.endpoint:
        flags += ["--endpoint", args.endpoint]
    if args.protocol:
        flags += ["--protocol", args.protocol]
    env = {}
    if args.headers is not None:
        env[OTEL_EXPORTER_OTLP_TRACES_HEADERS] = args.headers
    if args.timeout is not None:
        env[OTEL_EXPORTER_OTLP_TRACES_TIMEOUT] = f"{args.timeout:g}"
    if args.insecure:
        env[OTEL_EXPORTER_OTLP_TRACES_INSECURE] = "true"
    return tuple(flags), env


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through DemoJob's exit: the job is stopped too


def run(args: argparse.Namespace) -> int:
    if export_config(args) is None:  # checks the flags and OTEL_* variables the job will use
        return EXIT_UNUSABLE
    flags, env = _export_settings(args)
    plan = DemoPlan(out=Path(args.out).absolute(), metrics_port=metrics_base(WORLD_SIZE, args.metrics_port),
                    world_size=WORLD_SIZE, export_flags=flags, export_env=env)
    try:
        job = DemoJob(plan)
    except TorchMissing as exc:
        error(str(exc))
        return EXIT_UNUSABLE
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    print(intro(plan), flush=True)
    try:
        with job:
            return _show(job, plan)
    except KeyboardInterrupt:
        error("interrupted; the demo's job is stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _show(job: DemoJob, plan: DemoPlan) -> int:
    """Wait for the incident, scrape /metrics while the job is stuck, print it all, stop the job."""
    print(f"fr-otel demo: starting {plan.world_size} ranks (importing torch takes a while); rank {plan.stall_rank} "
          f"stalls at step {plan.stall_step}, the agent raises an incident after {plan.stall_seconds:g} s...",
          file=sys.stderr, flush=True)
    try:
        folder = job.wait_for_incident()
    except DemoFailed as exc:
        error(str(exc))
        print(job.log_tail(), file=sys.stderr)
        return EXIT_FAILED
    seconds = job.elapsed()
    scraped = scrape(plan.urls())
    problems: list[str] = []
    identity = read_identity(folder / INCIDENT_FILE, problems)
    if identity is None:
        error(problems[0] if problems else f"{folder / INCIDENT_FILE}: unreadable")
        return EXIT_FAILED
    found = Findings(plan, identity, scraped)
    print(render(found, folder, seconds), flush=True)
    took = job.stop(folder)
    print(f"fr-otel demo: stopped the job ({took:.1f} s); {job.elapsed():.1f} s in all. Its output: {plan.log}",
          file=sys.stderr)
    for line in found.problems():
        error(f"demo check failed: {line}")
    return EXIT_FAILED if found.problems() else EXIT_OK
