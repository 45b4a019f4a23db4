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
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from typing import IO, Any

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


def load_restricted(fileobj: IO[bytes]) -> Any:
    """Unpickle plain data (dict, list, tuple, str, bytes, numbers, bool, None) only.

    Pass a buffered binary file (``open(path, "rb")``): the C unpickler prefetches
    through ``peek`` and is as fast as ``pickle.load``; a bare ``BytesIO`` is ~3x slower.
    """
    return _RestrictedUnpickler(fileobj).load()


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
