"""Command lines fr-otel prints for people to run next: each word quoted for the shell.

A trace that could not be delivered is sent on later with ``fr-otel replay``; the report
page, the CLI, the watcher and the agent all print that command. The report's next step
for a culprit is ``ssh HOST py-spy dump --pid PID``. People paste these, and their words
come from files others can write (a host name in ``ranks.json``, a spool's path), so every
command is built here with :func:`shlex.join`: ``node7 $(touch /tmp/x)`` stays one quoted
word, never a command substitution. The report sits below the transport layers, so the
builders live here, taking plain values.

Secrets never appear: header values are shown as ``<value>``, and so is every value in an
endpoint's query string (``?api_key=<value>``), wherever an endpoint is printed
(:func:`shown_endpoint`: commands, the report, logs).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Sequence

from .names import host_name

__all__ = ["PLACEHOLDER_COLLECTOR", "exclude_command_lines", "py_spy_command_line", "replay_command_line", "shown_endpoint"]

PLACEHOLDER_COLLECTOR = "http://COLLECTOR:4317"


def replay_command_line(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    endpoint: str | None = None,
    protocol: str = "grpc",
    insecure: bool = False,
    header_names: Iterable[str] = (),
) -> str:
    """A complete ``fr-otel replay`` command line that sends ``path`` (or several; made absolute:
    it may be run from anywhere) to ``endpoint`` (a placeholder collector when None). Headers and
    query strings may hold secrets: only their names appear, each with a ``<value>`` to fill in."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    words = ["fr-otel", "replay", *(os.path.abspath(p) if str(p) else str(p) for p in paths)]
    if endpoint is None:
        words += ["--endpoint", PLACEHOLDER_COLLECTOR]
    else:
        words += ["--endpoint", shown_endpoint(endpoint)]
        if protocol != "grpc":
            words += ["--protocol", protocol]
        elif insecure and "://" not in endpoint:
            words.append("--insecure")
        names = list(header_names)
        if names:
            words += ["--headers", ",".join(f"{name}=<value>" for name in names)]
    return shlex.join(words)


def py_spy_command_line(what: str, pid: int | None, host: str | None = None) -> str:
    """``py-spy WHAT --pid PID`` (``PID`` to fill in when unknown), run over ``ssh HOST`` when the
    host is known; every word shell-quoted."""
    words = ["py-spy", what, "--pid", str(pid) if pid is not None else "PID"]
    return shlex.join(["ssh", host, *words] if host else words)


def exclude_command_lines(hosts: Sequence[str], reason: str) -> tuple[tuple[str, str], ...]:
    """(scheduler, command) pairs that leave ``hosts`` out of the next run: Slurm's ``--exclude`` for the
    resubmission and ``scontrol`` to drain them, Kubernetes' ``cordon``. Printed for a person (or a
    wrapper) to run: fr-otel never drains or cordons anything itself. Only host names (:func:`host_name`: no
    leading ``-`` that a command would take for an option, no comma that would split a list) are named."""
    hosts = [h for h in hosts if host_name(h)]
    if not hosts:
        return ()
    joined = ",".join(hosts)
    return (("Slurm", shlex.join(["sbatch", f"--exclude={joined}", "JOB_SCRIPT"])),
            ("Slurm", shlex.join(["scontrol", "update", f"NodeName={joined}", "State=DRAIN", f"Reason={reason}"])),
            *(("Kubernetes", shlex.join(["kubectl", "cordon", h])) for h in hosts))


def shown_endpoint(endpoint: str) -> str:
    """``endpoint`` as it may be printed: every query value replaced by ``<value>``, as header
    values are (collectors behind gateways take tokens as ``?api_key=...``)."""
    base, sep, rest = endpoint.partition("?")
    if not sep:
        return endpoint
    query, hash_sign, fragment = rest.partition("#")
    items = [f"{name}=<value>" if eq else ("<value>" if name else "")
             for name, eq, _ in (item.partition("=") for item in query.split("&"))]
    return f"{base}?{'&'.join(items)}" + (f"#{'<value>' if fragment else ''}" if hash_sign else "")
