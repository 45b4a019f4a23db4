"""The subcommands: name, the module that registers it and its one-line summary.

Kept apart from the modules so that ``fr-otel --help`` can list every command, and
``fr-otel analyze`` can run, without importing the others (run's agent, watch's loop,
the demo): a command's module loads only when that command is used.
"""

from __future__ import annotations

from collections import namedtuple

__all__ = ["COMMANDS", "Command", "command"]


# A named tuple, not a dataclass: `fr-otel --help` reads this table, and dataclasses (with the
# inspect module it imports) would be most of its start-up after argparse.
class Command(namedtuple("Command", ("name", "module", "summary"))):
    """``name``; ``module``: fr_otel.cli.<module> has register(subparsers), which adds this
    command's parser; ``summary``: its line in ``fr-otel --help``."""

    __slots__ = ()

    @property
    def description(self) -> str:
        """The summary as the first sentence of ``fr-otel NAME --help``."""
        return f"{self.summary[0].upper()}{self.summary[1:]}."


# Order is the order of `fr-otel --help`.
COMMANDS = (
    Command("analyze", "analyze", "name the culprit ranks of a hang, with evidence"),
    Command("export", "export", "analyse and export the incident as one OpenTelemetry trace (OTLP, or a local file)"),
    Command("replay", "export", "send OTLP JSON Lines files (export's local file, or a spool) to an OTLP endpoint"),
    Command("report", "report",
            "write the incident as one self-contained HTML page (verdict, timeline, groups, stacks)"),
    Command("demo", "demo", "run a real 4-rank gloo job on CPU under the live agent while one rank's data loader "
            "stalls: the verdict, /metrics, the trace and the report"),
    Command("watch", "watch",
            "wait for the dumps NCCL writes when ranks die; analyse and export each incident once"),
    Command("run", "run", "run a training command with the live agent in every rank (no code change)"),
)
_BY_NAME = {c.name: c for c in COMMANDS}


def command(name: str) -> Command:
    """The table's row for ``name`` (a module registering its own command asks by name)."""
    return _BY_NAME[name]
