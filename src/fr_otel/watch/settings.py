"""Where to watch and when an incident is ready: the dump folder, the file prefix, the ranks, the times.

NCCL names its automatic dumps ``<TORCH_FR_DUMP_TEMP_FILE><rank>``; without a folder the
watcher reads the same setting (or torchcomms', or torch's default), so it finds the dumps
where the job writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..read.dump_location import DEFAULT_DUMP_PREFIX, DUMP_PREFIX_ENVS, dump_location
from .state import STATE_NAME

__all__ = [
    "DEFAULT_DEADLINE_S",
    "DEFAULT_DUMP_PREFIX",
    "DEFAULT_POLL_S",
    "DEFAULT_SETTLE_S",
    "DUMP_PREFIX_ENVS",
    "WatchSettings",
    "dump_location",
    "parse_rank_set",
]

DEFAULT_SETTLE_S = 2.0
DEFAULT_DEADLINE_S = 60.0
DEFAULT_POLL_S = 0.5


def parse_rank_set(text: str) -> frozenset[int]:
    """``"0-7,16-23"`` -> those ranks; ValueError with a readable message otherwise."""
    ranks: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(f"bad rank range {part!r} (want e.g. 0-7,16-23)") from None
        if first < 0 or last < first:
            raise ValueError(f"bad rank range {part!r} (want e.g. 0-7,16-23)")
        ranks.update(range(first, last + 1))
    if not ranks:
        raise ValueError(f"no ranks in {text!r} (want e.g. 0-7,16-23)")
    return frozenset(ranks)


@dataclass(frozen=True, slots=True)
class WatchSettings:
    """What to watch and when an incident is ready (seconds throughout)."""

    directory: Path
    prefix: str | None = None
    expected_ranks: frozenset[int] | None = None  # None: the dumps' pg_config world, else only the deadline
    settle_s: float = DEFAULT_SETTLE_S
    deadline_s: float = DEFAULT_DEADLINE_S
    poll_s: float = DEFAULT_POLL_S
    state_path: Path | None = None  # default: directory / STATE_NAME
    out_dir: str | None = None  # embedded file and spools (incident_export's default when None)

    @property
    def state_file(self) -> Path:
        return self.state_path if self.state_path is not None else self.directory / STATE_NAME
