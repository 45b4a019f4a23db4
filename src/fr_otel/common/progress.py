"""Progress bars for people at a terminal: files read, spans sent.

Long steps (reading hundreds of dumps, sending a big trace) take a callback
``progress(done, total)``; the library never draws anything itself. The command line
hands them :meth:`TerminalProgress.task`, a tqdm bar on stderr that appears only when
stderr is a terminal, only once the step has run for :data:`DELAY_S`, and never with
``--quiet`` (tqdm's own ``TQDM_*`` variables, e.g. ``TQDM_DELAY``, are honoured). stdout (``--json``) is never touched. tqdm is imported only when a bar is
actually wanted, so this module costs nothing on the light path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

__all__ = ["DELAY_S", "ProgressCallback", "TerminalProgress", "no_progress"]

#: ``progress(done, total)``: called as a step advances; ``total`` may grow as work is found.
ProgressCallback = Callable[[int, int], None]

#: A bar appears only for work that has run this long: quick commands stay silent.
DELAY_S = 1.0


def no_progress(done: int, total: int) -> None:
    """The callback that shows nothing."""


class TerminalProgress:
    """Makes progress callbacks that draw a tqdm bar on ``stream`` (default stderr).

    ``enabled=None`` decides by the stream: a terminal shows bars, a pipe or file does not.
    """

    def __init__(self, enabled: bool | None = None, stream: IO[str] | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled

    @contextmanager
    def task(self, description: str, unit: str) -> Iterator[ProgressCallback]:
        """A callback for one step; its bar (if any) is removed when the step ends."""
        if not self.enabled:
            yield no_progress
            return
        from tqdm import tqdm

        sized = _columns(self.stream) > 0  # a terminal that reports no size still gets an 80-column bar
        ours: dict[str, Any] = {"delay": DELAY_S, "leave": False, "dynamic_ncols": sized,
                                "ncols": None if sized else 80,
                "nrows": None if sized else 24}
        # tqdm's own TQDM_* variables (TQDM_DELAY, TQDM_NCOLS, ...) win over our choices.
        settings = {k: v for k, v in ours.items() if f"TQDM_{k.upper()}" not in os.environ}
        bar: Any = tqdm(desc=description, unit=f" {unit}", file=self.stream, **settings)

        def update(done: int, total: int) -> None:
            if bar.total != total:
                bar.total = total
            bar.update(done - bar.n)

        try:
            yield update
        finally:
            bar.close()


def _columns(stream: IO[str]) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0
