"""Which part of a launch this process plays: a launcher (torchrun), or a process that may be a rank.

``srun ... fr-otel run -- torchrun ...`` puts the bootstrap into every Python process of the
job, the launcher included, and Slurm sets ``SLURM_PROCID`` in the launcher as well as in its
workers. The environment alone cannot tell them apart, so two rules work together:

- a *launcher* is recognised by what it runs: its command line (``torchrun``,
  ``python -m torch.distributed.run``/``launch``) before anything is imported, or later the
  launcher modules it has imported (a wrapper calling ``torch.distributed.run.main()``);
- a process *owns* an agent only once it has a process group (see ``Agent._on_ready``), so
  a launcher that was not recognised never claims the environment its workers inherit;
- a process the bootstrap starts an agent in is *marked* at once (:data:`FR_OTEL_RANK_PID`: its pid
  and a checksum of its rank variables). A child it starts before its process group exists (a
  ``subprocess`` or ``multiprocessing`` child) inherits the mark with the very same rank variables:
  it is a rank's child, not a rank, and starts no agent. A launcher's worker differs: the launcher
  gave it rank variables of its own (``RANK``, ``LOCAL_RANK``, torchrun's per-worker error file), so
  even the workers of a launcher that was taken for a rank at first start theirs.

Standard library only: the bootstrap imports this in every process that looks like a rank.
"""

from __future__ import annotations

import logging
import os
import sys
import zlib
from collections.abc import Container, Mapping, MutableMapping, Sequence

__all__ = ["FR_OTEL_RANK_PID", "LAUNCHER_MODULES", "RANK_VARIABLES", "child_of_a_rank", "in_launcher", "launcher_name",
           "mark_rank", "rank_variables", "rank_words"]

log = logging.getLogger("fr_otel.agent")

#: Set by launchers in the processes they start, one value per rank (or by Slurm per task).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID")

#: Set by the bootstrap in a process it starts an agent in: ``<pid> <checksum of its rank variables>``.
FR_OTEL_RANK_PID = "FR_OTEL_RANK_PID"
#: What a launcher sets per worker besides the rank variables (torchrun: its node's rank, each worker's
#: error file, the run and its restart), all in the checksum: a worker of a launcher never matches it.
_WORKER_VARIABLES = ("GROUP_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE")

#: Modules that make a process a launcher: it starts the ranks, it is not one (torchrun, the
#: old launch script, ``elastic_launch``). Training code imports none of them; the elastic
#: agent's own modules are no sign: ``torch.distributed.checkpoint`` imports them (torch 2.13).
LAUNCHER_MODULES = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "torch.distributed.launcher.api",
)
#: Console scripts that run a launcher module.
_LAUNCHER_SCRIPTS = ("torchrun",)
#: The launcher modules as files, for ``python .../torch/distributed/run.py``.
_LAUNCHER_FILES = tuple(os.path.join(*m.split(".")) + ".py" for m in LAUNCHER_MODULES)
#: Interpreter options that take a value as the next word (``-W error``, ``-X dev``).
_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def rank_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The rank variables set (non-empty) in ``environ``: a process with none is no rank."""
    return {name: environ[name].strip() for name in RANK_VARIABLES if environ.get(name, "").strip()}


def _rank_checksum(environ: Mapping[str, str]) -> str:
    """A checksum of what makes this process the rank it is (its rank variables and the launcher's per-worker ones)."""
    words = "\0".join(f"{name}={environ.get(name, '')}" for name in (*RANK_VARIABLES, *_WORKER_VARIABLES))
    return f"{zlib.crc32(words.encode('utf-8', 'replace')):08x}"


def child_of_a_rank(environ: Mapping[str, str], pid: int | None = None) -> bool:
    """True in a process that inherited a rank's mark (:data:`FR_OTEL_RANK_PID`) with that rank's very
    rank variables: a child the rank started, which is no rank of its own."""
    marked_pid, _, checksum = environ.get(FR_OTEL_RANK_PID, "").strip().partition(" ")
    if not marked_pid or marked_pid == str(os.getpid() if pid is None else pid):
        return False
    return checksum == _rank_checksum(environ)


def mark_rank(environ: MutableMapping[str, str], pid: int | None = None) -> None:
    """Mark this process as the rank its variables say (its children inherit the mark: :func:`child_of_a_rank`)."""
    environ[FR_OTEL_RANK_PID] = f"{os.getpid() if pid is None else pid} {_rank_checksum(environ)}"


def _main_of(argv: Sequence[str]) -> tuple[str, str] | None:
    """``("module", name)`` or ``("script", path)`` that a Python command line runs, else None."""
    words = list(argv[1:])
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-m":
            return ("module", words[i + 1]) if i + 1 < len(words) else None
        if word.startswith("-m") and not word.startswith("--"):
            return "module", word[2:]
        if word == "-c" or (word.startswith("-c") and not word.startswith("--")) or word in ("-", "--"):
            return None  # code on the command line or stdin: only its imports can tell
        if word in _OPTIONS_WITH_VALUE:
            i += 2
            continue
        if word.startswith("-"):
            i += 1
            continue
        return "script", word
    return None


def launcher_name(argv: Sequence[str] | None = None, modules: Container[str] | None = None) -> str | None:
    """What makes this process a launcher (``torchrun``, ``torch.distributed.run``...), or None.

    ``argv`` is the interpreter's own command line (default ``sys.orig_argv``: at start-up
    ``sys.argv`` does not hold the ``-m`` module yet); ``modules`` what is imported so far
    (default ``sys.modules``).
    """
    argv = getattr(sys, "orig_argv", sys.argv) if argv is None else argv
    modules = sys.modules if modules is None else modules
    main = _main_of(argv)
    if main is not None:
        kind, name = main
        if kind == "module" and name in LAUNCHER_MODULES:
            return name
        if kind == "script":
            base = os.path.basename(name)
            if base in _LAUNCHER_SCRIPTS or any(name.endswith(os.sep + f) for f in _LAUNCHER_FILES):
                return base
    return next((name for name in LAUNCHER_MODULES if name in modules), None)


def in_launcher() -> bool:
    """True in a launcher (torchrun...): it starts the ranks and is none of them, so it runs no
    agent; said at debug level only (its ranks run their own)."""
    name = launcher_name()
    if name is not None:
        log.debug("pid %d runs %s, a launcher, not a rank: no agent here; the ranks it starts run their own",
                  os.getpid(), name)
    return name is not None


def rank_words() -> str:
    """The rank variables that made this process look like a rank, for a log line."""
    return ", ".join(f"{k}={v}" for k, v in rank_variables(os.environ).items()) or "no rank variable set"
