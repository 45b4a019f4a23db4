"""The cyclic garbage collector paused around bulk decoding, restored as it was found.

Unpickling or decoding thousands of recorders allocates millions of containers; with the
collector on, each new generation triggers a rescan of the growing heap (~5x slower unpickling,
40 % of a 16k-rank coordinator's decoding). Reference counting still frees everything that is not
a cycle; a caller that may build cycles from untrusted input collects them itself.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic cyclic collection inside the block; afterwards the collector is on again only if it
    was on before (a user who turned it off keeps it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
