"""The ``fr-otel`` command line: one module per subcommand, registered here.

Each subcommand module has ``register(subparsers)``, which adds its parser and
sets ``func`` (``args -> exit code``). Subcommands turn flags into plain
arguments for the library and print what it returns; no analysis happens here.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from ..version import __version__
from . import analyze, demo, export, report, run, watch
from ._common import EXIT_NOT_DELIVERED, EXIT_OK, EXIT_UNUSABLE

__all__ = ["main", "EXIT_OK", "EXIT_UNUSABLE", "EXIT_NOT_DELIVERED"]

# Order is the order of `fr-otel --help`.
COMMANDS = (analyze, export, report, demo, watch, run)
#: gRPC's log level variable (DEBUG, INFO, ERROR, NONE).
GRPC_VERBOSITY = "GRPC_VERBOSITY"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fr-otel",
        description="Make hangs in distributed PyTorch training obvious: Flight Recorder dumps as a cross-rank "
        "verdict, OpenTelemetry traces and Prometheus metrics.",
    )
    parser.add_argument("--version", action="version", version=f"fr-otel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def _quiet_grpc() -> bool:
    """No raw gRPC C-core log lines (e.g. a TLS handshake failure) before fr-otel's own one-line
    error. Read when grpc is imported, so set here, before any command exports; a value the
    user set wins. Not for ``run``: its environment is the training job's. True when set here."""
    if GRPC_VERBOSITY in os.environ:
        return False
    os.environ[GRPC_VERBOSITY] = "NONE"
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fr-otel`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if argv[:1] == ["run"]:  # `run` reads its own arguments: its settings never stop the job
        return run.launch(_subparser(parser, "run"), argv[1:])
    quieted = _quiet_grpc()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    finally:
        if quieted:  # main() called in-process (tests, users' scripts) leaves the environment as it was
            os.environ.pop(GRPC_VERBOSITY, None)


if __name__ == "__main__":
    sys.exit(main())
