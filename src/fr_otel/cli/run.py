"""``fr-otel run [flags] -- COMMAND...``: run a training job with the agent in every rank.

Like ``opentelemetry-instrument``: the flags become ``FR_OTEL_*`` variables, the
bootstrap folder (a ``sitecustomize`` that starts the agent) goes first on ``PYTHONPATH``,
and this process becomes COMMAND (``exec``), so signals and the exit status are COMMAND's.

fr-otel's own settings never stop the job from starting: a bad flag or ``FR_OTEL_*``
value, an unknown flag or a flag without its value is one warning here, and the ranks use
the next source or the default. Only a missing COMMAND is a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..agent.config import (
    FR_OTEL_ABORT_MARK,
    FR_OTEL_AGENT_PID,
    FR_OTEL_AUTOSTART,
    FR_OTEL_RANK_PID,
    OPTIONS,
    FR_OTEL_ON_HANG,
    launch_environment,
)
from ..otlp.config import (
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    PROTOCOLS,
)
from ._common import EXIT_OK, EXIT_UNUSABLE, error
from .commands import command

__all__ = ["BOOTSTRAP_DIR", "Launch", "child_environment", "launch", "parse_launch", "register", "single_node",
           "with_job_secret"]

BOOTSTRAP_DIR = Path(__file__).resolve().parents[1] / "agent" / "guest" / "bootstrap"

DESCRIPTION = (
    "Run COMMAND (torchrun, srun, python ...) with the fr-otel agent in every rank, with no change to the "
    "training script. Each flag sets the FR_OTEL_* variable named in its help; variables already set are "
    "used when no flag is given. A bad value is a warning and the default is used: the job always starts. "
    "Export settings are the standard OTEL_EXPORTER_OTLP_* variables."
)
_EXPORT_FLAGS = {"--endpoint": "endpoint", "--protocol": "protocol"}


def _default_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _option_help(text: str, default: object, env: str, allowed: str = "") -> str:
    """``text (allowed; default: X; sets $ENV)``; a text that names its own default keeps it."""
    if text.endswith(")") and "(default: " in text:
        head, _, named = text[:-1].rpartition("(default: ")
        return f"{head}({allowed + '; ' if allowed else ''}default: {named}; sets ${env})"
    shown = "" if default is None else f"default: {_default_text(default)}; "
    return f"{text} ({allowed + '; ' if allowed else ''}{shown}sets ${env})"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The parser renders ``--help``; :func:`parse_launch` reads the arguments (it never refuses)."""
    parser = sub.add_parser(
        "run", help=command("run").summary, description=DESCRIPTION, usage="fr-otel run [flags] -- COMMAND [ARGS...]",
    )
    for option in OPTIONS:
        parser.add_argument(option.flag, dest=option.name, metavar=option.metavar, default=None,
                            help=_option_help(option.help, option.default, option.env, option.allowed))
    parser.add_argument("--endpoint", metavar="URL", help="OTLP endpoint for incident traces (default: "
                        f"$OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, else a local file; sets ${OTEL_EXPORTER_OTLP_TRACES_ENDPOINT})")
    parser.add_argument("--protocol", metavar="{" + ",".join(PROTOCOLS) + "}",
                        help="OTLP protocol (default: $OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL, else grpc; sets "
                        f"${OTEL_EXPORTER_OTLP_TRACES_PROTOCOL})")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the launcher and its arguments, after --")
    parser.set_defaults(func=None)


@dataclass
class Launch:
    """What ``fr-otel run`` was asked: flag values (by option name, raw), COMMAND, and problems."""

    flags: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    help: bool = False


def parse_launch(argv: Sequence[str]) -> Launch:
    """Split ``[flags] [--] COMMAND...``; unknown flags and missing values become problems.

    Every fr-otel flag takes one value (``--flag VALUE`` or ``--flag=VALUE``). COMMAND
    starts after ``--``, or at the first word that is not a flag or a flag's value.
    """
    names = {option.flag: option.name for option in OPTIONS} | _EXPORT_FLAGS
    argv = list(argv)
    has_separator = "--" in argv
    out = Launch()
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            out.command = argv[i + 1:]
            break
        if not token.startswith("-") or token == "-":
            out.command = argv[i:]
            break
        if token in ("-h", "--help"):
            out.help = True
            i += 1
            continue
        flag, eq, value = token.partition("=")
        takes_next = not eq and i + 1 < len(argv) and argv[i + 1] != "--"
        name = names.get(flag)
        if name is None:
            # An unknown flag's value is skipped only when a -- marks where COMMAND starts.
            skip = takes_next and has_separator and not argv[i + 1].startswith("-")
            out.problems.append(f"unknown flag {flag} ignored" + (f" (with {argv[i + 1]!r})" if skip else ""))
            i += 2 if skip else 1
            continue
        if eq:
            out.flags[name] = value
            i += 1
        elif takes_next:
            out.flags[name] = argv[i + 1]
            i += 2
        else:
            out.problems.append(f"{flag} needs a value; ignored")
            i += 1
    return out


#: torch's switch that gives each torchrun attempt its own store (see :func:`child_environment`).
TORCH_DISABLE_SHARE_RDZV_TCP_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def child_environment(flags: Mapping[str, str], environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The environment COMMAND runs in (flags as variables, the bootstrap on PYTHONPATH) and
    one line per setting that was ignored."""
    env, problems = launch_environment(flags, environ)
    endpoint = (flags.get("endpoint") or "").strip()
    if endpoint:
        env[OTEL_EXPORTER_OTLP_TRACES_ENDPOINT] = endpoint
    protocol = (flags.get("protocol") or "").strip().lower()
    if protocol in PROTOCOLS:
        env[OTEL_EXPORTER_OTLP_TRACES_PROTOCOL] = protocol
    elif protocol:
        problems.append(f"--protocol: expected one of {', '.join(PROTOCOLS)}, got {flags['protocol']!r}; ignored")
    problems.extend(_export_problems(env))
    paths = [str(BOOTSTRAP_DIR)]
    package_root = Path(__file__).resolve().parents[2]
    if package_root.name != "site-packages":  # a source checkout: make `import fr_otel` work in the ranks
        paths.append(str(package_root))
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([*paths, *([old] if old else [])])
    env[FR_OTEL_AUTOSTART] = "1"
    if env.get(FR_OTEL_ON_HANG, "").strip().lower() == "abort":
        # A restart is what abort is for; torchrun's shared rendezvous store hands a restarted attempt the
        # previous attempt's addresses (pytorch#135712: gloo and NCCL connect to ranks that are gone).
        env.setdefault(TORCH_DISABLE_SHARE_RDZV_TCP_STORE, "1")
    env.pop(FR_OTEL_AGENT_PID, None)
    env.pop(FR_OTEL_ABORT_MARK, None)  # set per run by supervise(), never inherited
    env.pop(FR_OTEL_RANK_PID, None)  # a job fr-otel run starts has its own ranks, none marked yet
    return env, problems


#: Launchers that start ranks on more than one node from one command (each node's ``fr-otel run`` would make its own).
_MULTI_NODE_LAUNCHERS = ("srun", "mpirun", "mpiexec", "jsrun", "aprun")


def single_node(command: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether COMMAND starts every rank of its job on this node: no multi-node launcher, no ``--nnodes`` other
    than 1, and not one of several nodes of a Slurm allocation (``SLURM_JOB_NUM_NODES``/``SLURM_NNODES``)."""
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        if environ.get(name, "1").strip() not in ("", "1"):
            return False
    words = list(command)
    if any(Path(word).name in _MULTI_NODE_LAUNCHERS for word in words[:1]):
        return False
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if flag == "--nnodes":
            value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            if value.strip() not in ("1", "1:1"):
                return False
    return True


def with_job_secret(command: Sequence[str], env: dict[str, str]) -> None:
    """Give a single-node job a fresh secret for its store records (:mod:`fr_otel.agent.links.signing`) unless the
    launcher gave one; a multi-node job takes the one its launcher hands to every node (one per node would make
    every node's records forgeries to the others)."""
    from ..agent.links.signing import JOB_SECRET_ENV, JOB_SECRET_FILE_ENV, new_secret

    if not env.get(JOB_SECRET_ENV) and not env.get(JOB_SECRET_FILE_ENV) and single_node(command, env):
        env[JOB_SECRET_ENV] = new_secret()


def _export_problems(env: Mapping[str, str]) -> list[str]:
    """Say now, once, what each rank would otherwise say: the OTLP settings are unusable."""
    from ..otlp.config import resolve_export_config

    warnings: list[str] = []
    try:
        resolve_export_config(environ=env, warnings=warnings)
    except ValueError as exc:
        return [f"{exc}; the ranks will write incident traces to local files instead"]
    return warnings


#: Signals ``fr-otel run`` passes on to COMMAND when it runs it as a child (as tini does): every one whose default
#: would end this process and leave COMMAND running unsupervised. COMMAND runs in its own process group, so a
#: terminal's Ctrl-C reaches only this process, and is passed on once.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGALRM, signal.SIGUSR1,
                     signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1


def _owned_by(parent: int) -> Callable[[], None]:
    """What COMMAND's process runs before it starts: its own process group (a terminal's Ctrl-C then reaches only
    the supervisor, which passes it on once), and SIGTERM to it when the supervisor dies, whatever killed it
    (``PR_SET_PDEATHSIG``, where the kernel has it; torchrun then ends its ranks): a job never outlives it."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: nothing to load after it
    except (OSError, AttributeError):
        prctl = None

    def arm() -> None:
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before the call: as if it had come after
            os.kill(os.getpid(), signal.SIGTERM)
    return arm


def _mark_file() -> tuple[int, str]:
    """The file the ranks write their attempts into: created private, unlinked at once and held open here, the ranks
    given ``/proc/<pid>/fd/<n>`` (the same file, while this process lives), so no /tmp cleaner can take it and a
    killed supervisor leaves nothing behind. Without /proc: the file's own path (removed at the end)."""
    fd, path = tempfile.mkstemp(prefix="fr-otel-abort-")
    held = f"/proc/{os.getpid()}/fd/{fd}"
    if os.path.exists(held):
        os.unlink(path)
        return fd, held
    return fd, path


def _marks(fd: int, path: str) -> list[list[str]]:
    """The lines the ranks wrote (``start N``, ``abort N RANK CODE``), split into words; none when unreadable."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        raw = b""
    finally:
        os.close(fd)
        if not path.startswith("/proc/"):
            with contextlib.suppress(OSError):
                os.unlink(path)
    return [line.split() for line in raw.decode("utf-8", "replace").splitlines()]


def supervise(command: Sequence[str], env: dict[str, str]) -> int:
    """``--on-hang abort``: run COMMAND as a child instead of becoming it, passing signals on, and exit with
    the abort's own code when it failed and its last attempt (torchrun restarts it) ended a hang: 70 when the
    verdict's action is to fix the code, else 75 (:data:`fr_otel.diagnosis.restart.EXIT_CODES`). torchrun exits 1
    for any failed worker, and the scheduler's restart rules need the abort's own code. Any other failure keeps
    its status. The ranks say what happened in a private file (:func:`~fr_otel.agent.hang_abort.mark_attempt`)
    this process holds open (:func:`_mark_file`); COMMAND dies with this process (:func:`_owned_by`)."""
    from ..agent.hang_abort import ABORT_EXIT_CODE, CODE_FAULT_EXIT_CODE

    fd, mark = _mark_file()
    env[FR_OTEL_ABORT_MARK] = mark
    child: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if child:
            child[0].send_signal(signum)
        else:
            pending.append(signum)  # before the child exists: passed on once it does
    for sig in FORWARDED_SIGNALS:  # before the child starts: no window where a signal ends us alone
        signal.signal(sig, forward)
    try:
        child.append(subprocess.Popen(list(command), env=env, preexec_fn=_owned_by(os.getpid())))
    except OSError as exc:
        _marks(fd, mark)
        error(f"cannot run {command[0]}: {exc.strerror or exc}")
        return 127
    for signum in pending:
        child[0].send_signal(signum)
    status = child[0].wait()
    lines = _marks(fd, mark)
    attempts = {int(w[1]) for w in lines if len(w) >= 2 and w[0] in ("start", "abort") and w[1].isdigit()}
    last = str(max(attempts, default=-1))
    # ``abort ATTEMPT RANK CODE``: the code each rank ended with (70: fix the code; 75: restart).
    aborted = {w[2]: int(w[3]) if len(w) == 4 and w[3] == str(CODE_FAULT_EXIT_CODE) else ABORT_EXIT_CODE
               for w in lines if len(w) in (3, 4) and w[0] == "abort" and w[1] == last and w[2].isdigit()}
    if status != 0 and aborted:
        code = min(aborted.values())  # every rank read one verdict; a code fault's word wins over a restart's
        then = ("do not resubmit: the culprit stopped in its own code, so a restart would hang again"
                if code == CODE_FAULT_EXIT_CODE else "for the scheduler to restart the job")
        error(f"{command[0]} exited with {status} after rank(s) {','.join(sorted(aborted, key=int))} ended a hang "
              f"(--on-hang abort): exit code {code}, {then}")
        return code
    return status if status >= 0 else 128 - status


#: Launchers that may start ranks on other hosts without the environment ``fr-otel run`` gives them (the
#: bootstrap on PYTHONPATH, FR_OTEL_AUTOSTART): what passes it on there, for the one line said at launch.
_REMOTE_LAUNCHERS = {
    "mpirun": "mpirun -x PYTHONPATH -x FR_OTEL_AUTOSTART", "mpiexec": "mpiexec -x PYTHONPATH -x FR_OTEL_AUTOSTART",
    "deepspeed": "PYTHONPATH and FR_OTEL_AUTOSTART=1 in .deepspeed_env",
    "pdsh": "PYTHONPATH and FR_OTEL_AUTOSTART=1 in the remote command's environment",
}


def unfollowed_launcher(command: Sequence[str]) -> str | None:
    """The line that says ``fr-otel run`` may not reach the ranks COMMAND starts on other hosts, and the fix."""
    name = os.path.basename(command[0]) if command else ""
    how = _REMOTE_LAUNCHERS.get(name)
    if how is None:
        return None
    return (f"{name} may start ranks on other hosts without fr-otel run's environment: there, no agent (no "
            f"'agent on' line from those hosts) unless it is passed on ({how}), or call fr_otel.start() at the top "
            "of the training script")


def launch(parser: argparse.ArgumentParser, argv: Sequence[str]) -> int:
    """``fr-otel run``: warn about ignored settings, then become COMMAND (with ``--on-hang abort``: run it, see
    :func:`supervise`)."""
    request = parse_launch(argv)
    if request.help:
        parser.print_help()
        return EXIT_OK
    if not request.command:
        for line in request.problems:
            error(line)
        error("run needs a command after --, e.g. fr-otel run -- torchrun --nproc-per-node 8 train.py")
        return EXIT_UNUSABLE
    env, problems = child_environment(request.flags, os.environ)
    for line in [*request.problems, *problems]:
        error(f"{line} (the job starts anyway)")
    if (unfollowed := unfollowed_launcher(request.command)) is not None:
        error(unfollowed)
    sys.stdout.flush()
    sys.stderr.flush()
    command = request.command
    with_job_secret(command, env)
    if env.get(FR_OTEL_ON_HANG, "").strip().lower() == "abort":
        return supervise(command, env)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        error(f"cannot run {command[0]}: {exc.strerror or exc}")
        return 127
    return 0  # not reached
