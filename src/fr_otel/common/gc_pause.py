"""The cyclic garbage collector paused around bulk decoding, restored as it was found.

Unpickling or decoding thousands of recorders allocates millions of containers; with the
collector on, each new generation triggers a rescan of the growing heap (~5x slower unpickling,
40 % of a 16k-rank coordinator's decoding). Reference counting still frees everything that is not
a cycle; a caller that may build cycles from untrusted input collects them itself.

Pauses nest and overlap across threads (the agent's poll thread reads its recorder while the
coordinator gathers): only the outermost one ends the pause, and it turns the collector back on
only if it was on when the first pause began. A user who turned it off before (Megatron's
``--manual-gc``) keeps it off.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic cyclic collection inside the block (whichever thread is in one)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
