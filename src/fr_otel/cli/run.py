"""``fr-otel run [flags] -- COMMAND...``: run a training job with the agent in every rank.

Like ``opentelemetry-instrument``: the flags become ``FR_OTEL_*`` variables, the
bootstrap folder (a ``sitecustomize`` that starts the agent) goes first on ``PYTHONPATH``,
and this process becomes COMMAND (``exec``), so signals and the exit status are COMMAND's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..agent.config import FR_OTEL_AGENT_PID, FR_OTEL_AUTOSTART, OPTIONS
from ._common import EXIT_UNUSABLE, error

__all__ = ["BOOTSTRAP_DIR", "child_environment", "register", "run"]

BOOTSTRAP_DIR = Path(__file__).resolve().parents[1] / "agent" / "bootstrap"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "run", help="run a training command with the live agent in every rank (no code change)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="fr-otel run [flags] -- COMMAND [ARGS...]",
    )
    for option in OPTIONS:
        parser.add_argument(option.flag, dest=option.name, metavar=option.env, default=None,
                            help=f"{option.help} (sets ${option.env})")
    parser.add_argument("--endpoint", help="OTLP endpoint (sets $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)")
    parser.add_argument("--protocol", choices=("grpc", "http/protobuf", "http/json"),
                        help="sets $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the launcher and its arguments, after --")
    parser.set_defaults(func=run)


def child_environment(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, str]:
    """The environment COMMAND runs in: flags as variables, the bootstrap on PYTHONPATH."""
    env = dict(environ)
    for option in OPTIONS:
        value = getattr(args, option.name, None)
        if value is not None:
            env[option.env] = str(value)
    if getattr(args, "endpoint", None):
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = args.endpoint
    if getattr(args, "protocol", None):
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = args.protocol
    paths = [str(BOOTSTRAP_DIR)]
    package_root = Path(__file__).resolve().parents[2]
    if package_root.name != "site-packages":  # a source checkout: make `import fr_otel` work in the ranks
        paths.append(str(package_root))
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([*paths, *([old] if old else [])])
    env[FR_OTEL_AUTOSTART] = "1"
    env.pop(FR_OTEL_AGENT_PID, None)
    return env


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        error("run needs a command after --, e.g. fr-otel run -- torchrun --nproc-per-node 8 train.py")
        return EXIT_UNUSABLE
    from ..agent.config import resolve_config

    _, problems = resolve_config(environ=child_environment(args, dict(os.environ)))
    if problems:
        for line in problems:
            error(line)
        return EXIT_UNUSABLE
    env = child_environment(args, dict(os.environ))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        error(f"cannot run {command[0]}: {exc.strerror or exc}")
        return 127
    return 0  # not reached
