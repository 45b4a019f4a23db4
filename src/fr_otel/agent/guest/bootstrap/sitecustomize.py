"""Start the fr-otel agent in every training process, with no change to the training script.

``fr-otel run`` puts this folder first on ``PYTHONPATH`` and sets ``FR_OTEL_AUTOSTART=1``;
Python imports ``sitecustomize`` at start-up in every process of the job. This one:

1. runs the ``sitecustomize`` it shadows, if any (the next one on ``sys.path``);
2. starts the agent only in what may be a rank: ``RANK``, ``LOCAL_RANK`` or ``SLURM_PROCID``
   set; not a launcher (``torchrun`` under ``srun`` has ``SLURM_PROCID`` too: see
   :mod:`fr_otel.agent.guest.role`), and not a child of a rank: one whose agent already owns it (data
   loader workers, subprocesses: ``FR_OTEL_AGENT_PID`` is someone else's), or one started before
   the rank had a process group (``FR_OTEL_RANK_PID`` is someone else's, with the same rank
   variables: :func:`fr_otel.agent.guest.role.child_of_a_rank`). A process it starts the agent in is marked
   so at once;
3. in a process with no rank variable yet (Lightning's ``ddp`` rank 0, ``ddp_spawn`` and
   ``torch.multiprocessing.spawn`` children, mpirun ranks), starts the agent when the process calls
   ``init_process_group`` (:mod:`fr_otel.agent.guest.late_rank`): only a rank ever does.

``fr_otel.agent.start()`` imports no torch: the agent waits for the script's own
``init_process_group``, and only then claims ``FR_OTEL_AGENT_PID``. Nothing here may
break the interpreter's start-up.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types


def _chain_previous() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_fr_otel_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


def _is_rank(env: os._Environ[str]) -> bool | None:
    """True: a rank (marked now); None: a process that may become one (no rank variable yet); False: neither."""
    if env.get("FR_OTEL_AUTOSTART", "").strip().lower() not in ("1", "true", "yes", "on"):
        return False
    owner = env.get("FR_OTEL_AGENT_PID", "").strip()
    if owner and owner != str(os.getpid()):
        return False  # a child of a rank that runs an agent
    role = _guest("role")
    if role.launcher_name() is not None or role.child_of_a_rank(env):
        return False
    if not role.rank_variables(env):
        return None
    role.mark_rank(env)
    return True


def _start_late() -> None:
    """The agent of a process that has just called ``init_process_group`` (its rank variables are set by now)."""
    _guest("role").mark_rank(os.environ)
    from fr_otel.agent import start

    start()


def _guest(name: str) -> types.ModuleType:
    """A stdlib-only module of :mod:`fr_otel.agent.guest` without importing the ``fr_otel`` package: a
    process that is no rank (a launcher, a helper) must not pay for it."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_fr_otel_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _main() -> None:
    try:
        _chain_previous()
    except Exception as exc:  # noqa: BLE001 - their sitecustomize failing is theirs to report
        print(f"fr-otel: the sitecustomize shadowed by fr-otel's failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        rank = _is_rank(os.environ)
        if rank is None:
            _guest("late_rank").follow_init(_start_late)
        if not rank:
            return
        from fr_otel.agent import start

        start()
    except Exception as exc:  # noqa: BLE001 - never break the interpreter's start-up
        print(f"fr-otel: agent not started: {type(exc).__name__}: {exc}", file=sys.stderr)


_main()
