"""Command lines fr-otel prints for people to run next.

A trace that could not be delivered is sent on later with ``fr-otel replay``; the report
page, the CLI, the watcher and the agent all print that command. The report sits below
the transport layers, so the one builder lives here, taking plain values.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable

__all__ = ["PLACEHOLDER_COLLECTOR", "replay_command_line"]

PLACEHOLDER_COLLECTOR = "http://COLLECTOR:4317"


def replay_command_line(
    path: str | os.PathLike[str],
    *,
    endpoint: str | None = None,
    protocol: str = "grpc",
    insecure: bool = False,
    header_names: Iterable[str] = (),
) -> str:
    """A complete ``fr-otel replay`` command line that sends ``path`` (made absolute: it may be
    run from anywhere) to ``endpoint`` (a placeholder collector when None). Headers may hold
    secrets: only their names appear, each with a ``<value>`` to fill in."""
    words = ["fr-otel", "replay", os.path.abspath(path) if str(path) else str(path)]
    if endpoint is None:
        words += ["--endpoint", PLACEHOLDER_COLLECTOR]
    else:
        words += ["--endpoint", endpoint]
        if protocol != "grpc":
            words += ["--protocol", protocol]
        elif insecure and "://" not in endpoint:
            words.append("--insecure")
        names = list(header_names)
        if names:
            words += ["--headers", ",".join(f"{name}=<value>" for name in names)]
    return shlex.join(words)
