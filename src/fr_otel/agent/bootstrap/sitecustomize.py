"""Start the fr-otel agent in every training process, with no change to the training script.

``fr-otel run`` puts this folder first on ``PYTHONPATH`` and sets ``FR_OTEL_AUTOSTART=1``;
Python imports ``sitecustomize`` at start-up in every process of the job. This one:

1. runs the ``sitecustomize`` it shadows, if any (the next one on ``sys.path``);
2. starts the agent only in a rank: ``RANK`` or ``LOCAL_RANK`` set (torchrun, Slurm via
   ``SLURM_PROCID``), not the launcher itself, and not a process whose parent already runs
   an agent (data loader workers, subprocesses: ``FR_OTEL_AGENT_PID`` is someone else's).

``fr_otel.agent.start()`` imports no torch: the agent waits for the script's own
``init_process_group``. Nothing here may break the interpreter's start-up.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _chain_previous() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_fr_otel_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


def _is_rank(env: os._Environ[str]) -> bool:
    if env.get("FR_OTEL_AUTOSTART", "").strip().lower() not in ("1", "true", "yes", "on"):
        return False
    owner = env.get("FR_OTEL_AGENT_PID", "").strip()
    if owner and owner != str(os.getpid()):
        return False  # a child of a process that runs an agent
    return any(env.get(name, "").strip() for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))


def _main() -> None:
    try:
        _chain_previous()
    except Exception as exc:  # noqa: BLE001 - their sitecustomize failing is theirs to report
        print(f"fr-otel: the sitecustomize shadowed by fr-otel's failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    if not _is_rank(os.environ):
        return
    try:
        from fr_otel.agent import start

        start()
    except Exception as exc:  # noqa: BLE001 - never break the interpreter's start-up
        print(f"fr-otel: agent not started: {type(exc).__name__}: {exc}", file=sys.stderr)


_main()
