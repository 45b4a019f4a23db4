"""Which part of a launch this process plays: a launcher (torchrun), or a process that may be a rank.

``srun ... fr-otel run -- torchrun ...`` puts the bootstrap into every Python process of the
job, the launcher included, and Slurm sets ``SLURM_PROCID`` in the launcher as well as in its
workers. The environment alone cannot tell them apart, so two rules work together:

- a *launcher* is recognised by what it runs: its command line (``torchrun``,
  ``python -m torch.distributed.run``/``launch``) before anything is imported, or later the
  launcher modules it has imported (a wrapper calling ``torch.distributed.run.main()``);
- a process *owns* an agent only once it has a process group (see ``Agent._on_ready``), so
  a launcher that was not recognised never claims the environment its workers inherit.

Standard library only: the bootstrap imports this in every process that looks like a rank.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Container, Mapping, Sequence

__all__ = ["LAUNCHER_MODULES", "RANK_VARIABLES", "in_launcher", "launcher_name", "rank_variables", "rank_words"]

log = logging.getLogger("fr_otel.agent")

#: Set by launchers in the processes they start, one value per rank (or by Slurm per task).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID")

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
