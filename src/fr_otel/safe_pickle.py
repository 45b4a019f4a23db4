"""Load Flight Recorder pickles without ever running code from them.

Dump files come from shared disks and are untrusted. A plain ``pickle.load`` can
import and call anything the file names (``os.system`` included). Real dumps hold
only dicts, lists, tuples, str, int, float, bool and None, none of which need a
global, so the restricted unpickler refuses *every* global and persistent id: it
loses nothing and keeps the C unpickler's speed (``find_class`` is only consulted
for GLOBAL/STACK_GLOBAL opcodes).
"""

from __future__ import annotations

import pickle
from typing import IO, Any

__all__ = ["ForbiddenPickle", "load_restricted"]


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
