"""The ``fr-otel`` command line: one module per subcommand, listed in :mod:`.commands`.

Each subcommand module has ``register(subparsers)``, which adds its parser and
sets ``func`` (``args -> exit code``). Only the module of the command being run is
imported (the others get a parser with their summary, for ``--help``): ``fr-otel analyze``
does not load the agent, the watcher or the demo, and ``fr-otel --help`` or ``--version``
loads no subcommand at all (they start in the time of a bare interpreter). Subcommands turn flags into plain
arguments for the library and print what it returns; no analysis happens here.
"""

from __future__ import annotations

import os
import sys
from importlib import import_module

from ..version import __version__
from .commands import COMMANDS
from .exit_codes import EXIT_LOST, EXIT_NOT_DELIVERED, EXIT_OK, EXIT_STATUS_HELP, EXIT_UNUSABLE

TYPE_CHECKING = False  # typing itself is a few ms of `fr-otel --version`
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

__all__ = ["main", "EXIT_OK", "EXIT_UNUSABLE", "EXIT_NOT_DELIVERED", "EXIT_LOST"]

_COMMAND_NAMES = frozenset(c.name for c in COMMANDS)

#: gRPC's log level variable (DEBUG, INFO, ERROR, NONE).
GRPC_VERBOSITY = "GRPC_VERBOSITY"


def _parser(only: str | None = "") -> argparse.ArgumentParser:
    """Every command's full parser (``only=""``, the default: tests read them all); with ``only``
    a command name, just that command's, and a summary-only parser for each other command;
    with None, summary-only parsers for all (``fr-otel --help``, ``--version``)."""
    import argparse  # here: `fr-otel --version` needs no parser

    parser = argparse.ArgumentParser(
        prog="fr-otel",
        formatter_class=_help_formatter,
        description="Make hangs in distributed PyTorch training obvious: Flight Recorder dumps as a cross-rank "
        "verdict, OpenTelemetry traces and Prometheus metrics.",
        epilog=EXIT_STATUS_HELP,
    )
    parser.add_argument("--version", action="version", version=f"fr-otel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = {c.module for c in COMMANDS if only == "" or c.name == only}
    registered: set[str] = set()
    for command in COMMANDS:
        if command.module in registered:
            continue  # its module added it with an earlier command (export adds replay)
        if command.module in wanted:
            import_module(f"{__name__}.{command.module}").register(sub)
            registered.add(command.module)
        else:
            sub.add_parser(command.name, help=command.summary, add_help=False)  # its summary only: never parses
    return parser


def _help_formatter(prog: str) -> argparse.HelpFormatter:
    """argparse's own formatter, told the terminal's width: left to itself it imports shutil for
    that alone (with bz2, lzma and zlib), a sixth of ``fr-otel --help``."""
    import argparse

    return argparse.HelpFormatter(prog, width=_columns() - 2)  # argparse keeps 2 columns free


def _columns() -> int:
    """``shutil.get_terminal_size().columns``: $COLUMNS, else the terminal's width, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            stdout = sys.__stdout__  # None without a console (pythonw)
            columns = os.get_terminal_size(stdout.fileno()).columns if stdout is not None else 0
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    import argparse

    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    parsers: dict[str, argparse.ArgumentParser] = sub.choices
    return parsers[name]


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
    if argv == ["--version"]:  # argparse's answer, without argparse and the regex engine it loads
        print(f"fr-otel {__version__}")
        return EXIT_OK
    # Only the named command's parser (the others get a summary-only one): `fr-otel analyze`
    # imports neither the agent nor the exporter, and `--help` or `--version` (no command)
    # nothing but argparse. fr-otel's own options take no value, so the command is the first
    # word that is not an option, wherever it stands (`fr-otel -q analyze --help`).
    named = next((a for a in argv if not a.startswith("-")), None)
    named = named if named in _COMMAND_NAMES else None
    parser = _parser(only=named)
    if argv[:1] == ["run"]:  # `run` reads its own arguments: its settings never stop the job
        from .run import launch

        return launch(_subparser(parser, "run"), argv[1:])
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
