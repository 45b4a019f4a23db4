"""A rank that no variable announces: its agent starts when it calls ``init_process_group``.

Some launchers set the rank variables only inside Python, after start-up: Lightning's ``ddp``
(the process the user started becomes global rank 0 and sets ``LOCAL_RANK`` itself), ``ddp_spawn``
and ``torch.multiprocessing.spawn`` (each child gets its rank as an argument), mpirun (its own
variables). At start-up such a process looks like any helper, and starting an agent in every helper
of a job would cost each one an import and warn about a process group that never comes. So the
bootstrap gives such a process only a watch: once ``torch.distributed`` is imported, its
``init_process_group`` starts the agent first (the recorder is sized before the group exists),
exactly as ``fr_otel.start()`` at the top of the script would. A process that never calls it (a
spawning parent, a data loader worker) never pays more than one name comparison per import.

Standard library only: the bootstrap loads this in every process of the job that may become a rank.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["follow_init"]

#: The module whose import means the process may create a process group.
_WATCHED = "torch.distributed"


def _wrapped(original: Callable[..., Any], start: Callable[[], object]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        try:
            start()
        except Exception as exc:  # noqa: BLE001 - never in the way of the training script's own call
            print(f"fr-otel: agent not started: {type(exc).__name__}: {exc}", file=sys.stderr)
        return original(*args, **kwargs)

    init_process_group.__fr_otel_wrapped__ = True  # type: ignore[attr-defined]
    return init_process_group


def _patch(module: ModuleType, start: Callable[[], object]) -> None:
    """Replace ``init_process_group`` wherever torch.distributed has bound it by name so far."""
    original = getattr(module, "init_process_group", None)
    if original is None or getattr(original, "__fr_otel_wrapped__", False):
        return
    wrapper = _wrapped(original, start)
    for name, loaded in list(sys.modules.items()):
        if (name == _WATCHED or name.startswith(_WATCHED + ".")) and \
                getattr(loaded, "init_process_group", None) is original:
            loaded.init_process_group = wrapper  # type: ignore[attr-defined]


class _Watch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``torch.distributed`` is about to load, it wraps that module's loader."""

    def __init__(self, start: Callable[[], object]) -> None:
        self.start = start

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _WATCHED:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]  # once; and no recursion below
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            try:
                _patch(module, self.start)
            except Exception as exc:  # noqa: BLE001 - never break the import
                print(f"fr-otel: cannot follow init_process_group: {type(exc).__name__}: {exc}", file=sys.stderr)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def follow_init(start: Callable[[], object]) -> None:
    """Call ``start`` in this process when it first calls ``torch.distributed.init_process_group``."""
    loaded = sys.modules.get(_WATCHED)
    if loaded is not None:
        _patch(loaded, start)
        return
    sys.meta_path.insert(0, _Watch(start))
