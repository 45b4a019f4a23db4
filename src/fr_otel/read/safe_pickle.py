"""Load Flight Recorder pickles without ever running code from them, in bounded memory.

Dump files come from shared disks and are untrusted. A plain ``pickle.load`` can
import and call anything the file names (``os.system`` included). Real dumps hold
only dicts, lists, tuples, str, int, float, bool and None, none of which need a
global, so the restricted unpickler refuses *every* global and persistent id: it
loses nothing and keeps the C unpickler's speed (``find_class`` is only consulted
for GLOBAL/STACK_GLOBAL opcodes).

Memory is bounded too. The C unpickler trusts the sizes a file states: a 9-byte
pickle whose ``LONG_BINPUT`` names memo slot 2**27 makes it allocate (and zero) 2 GiB,
and a ``BINUNICODE8`` header can ask for any length. :func:`memory_budget` caps what
one load may allocate at a small multiple of the file's size (an ``RLIMIT_DATA``
soft limit, raised back afterwards), so such a file fails fast with ``MemoryError``
before touching the memory. Only single-purpose processes (the CLI, ``watch``, the
reader's workers) use it: never call it inside a training process.

Time is bounded too. CPython's int hash is the value modulo 2**61 - 1, so a dict of keys
``k * (2**61 - 1)`` takes quadratic time to build (1.1 MB of pickle: 27 s). Dumps key their
dicts by strings and small ints only, so before loading, :mod:`fr_otel.read.pickle_keys`
walks the opcodes (in C where built: ~2-4% of the load) and any other dict key, or a set,
refuses the file.
"""

from __future__ import annotations

import contextlib
import io
import pickle
from collections.abc import Iterator
from typing import Any

from .pickle_keys import MEMO_PROBLEM, key_problem

__all__ = ["DEFAULT_MAX_FILE_BYTES", "ForbiddenPickle", "load_restricted", "memory_budget", "budget_for"]

#: Dumps larger than this are refused unless the caller raises the cap (``--max-file-size``).
DEFAULT_MAX_FILE_BYTES = 1 << 30
#: What one load may allocate: this much, plus this many times the file's size.
_BUDGET_BASE = 128 << 20
_BUDGET_PER_BYTE = 16


class ForbiddenPickle(pickle.UnpicklingError):
    """The pickle asked for a global or persistent object: it is not a plain dump."""


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D102 - see module doc
        raise ForbiddenPickle(f"refuses to load global {module}.{name} (dumps hold only plain data)")

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        raise ForbiddenPickle("refuses persistent ids (dumps hold only plain data)")


def load_restricted(data: bytes) -> tuple[Any, int]:
    """Unpickle plain data (dict, list, tuple, str, bytes, numbers, bool, None) only; returns the
    object and how many bytes of ``data`` the pickle took (more is trailing data).

    Raises :class:`ForbiddenPickle` for a global, a persistent id, a set or a dict key that is
    not a string or a small int (:func:`~fr_otel.read.pickle_keys.key_problem`), MemoryError
    for a memo index no pickler writes, and what the unpickler raises for a corrupt file.
    """
    problem = key_problem(data)
    if problem == MEMO_PROBLEM:
        raise MemoryError(problem)
    if problem is not None:
        raise ForbiddenPickle(f"refuses {problem}")
    # The C unpickler prefetches through peek(): as fast as pickle.loads; a bare BytesIO is ~3x slower.
    stream = io.BufferedReader(io.BytesIO(data), buffer_size=1 << 16)
    value = _RestrictedUnpickler(stream).load()
    return value, stream.tell()


def budget_for(file_bytes: int) -> int:
    """Bytes one load of a ``file_bytes`` dump may allocate (unpickled dumps take ~5-10x their size)."""
    return _BUDGET_BASE + _BUDGET_PER_BYTE * max(file_bytes, 0)


def _data_in_use() -> int | None:
    """This process's data segment (what RLIMIT_DATA counts), from /proc; None where unknown."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@contextlib.contextmanager
def memory_budget(extra_bytes: int) -> Iterator[None]:
    """Let the block allocate at most ``extra_bytes`` more (process-wide soft limit); no-op where unsupported."""
    try:
        import resource
    except ImportError:  # not POSIX
        yield
        return
    used = _data_in_use()
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    except (OSError, ValueError):
        used = None
    if used is None:
        yield
        return
    limit = used + extra_bytes
    if soft != resource.RLIM_INFINITY:
        limit = min(limit, soft)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
