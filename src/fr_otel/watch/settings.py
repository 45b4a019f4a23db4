"""Where to watch and when an incident is ready: the dump folder, the file prefix, the ranks, the times.

NCCL names its automatic dumps ``<TORCH_FR_DUMP_TEMP_FILE><rank>``; without a folder the
watcher reads the same setting (or torchcomms', or torch's default), so it finds the dumps
where the job writes them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

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

#: Where NCCL writes its automatic dumps: the current name first, then the old one; then
#: torchcomms' FlightRecorderHook (JSON, ``<prefix><rank>``, default ``torchcomm_fr_trace_``).
DUMP_PREFIX_ENVS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCHCOMM_FR_DUMP_TEMP_FILE")
DEFAULT_DUMP_PREFIX = "~/.cache/torch/comm_lib_trace_rank_"
DEFAULT_SETTLE_S = 2.0
DEFAULT_DEADLINE_S = 60.0
DEFAULT_POLL_S = 0.5


def dump_location(
    directory: str | os.PathLike[str] | None, prefix: str | None, env: Mapping[str, str] | None = None
) -> tuple[Path, str | None]:
    """The folder to watch and the dump file name prefix (None: any name ending in a rank).

    Without ``directory`` both come from NCCL's own setting (``TORCH_FR_DUMP_TEMP_FILE``, else
    ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``), else torchcomms' (``TORCHCOMM_FR_DUMP_TEMP_FILE``),
    else torch's default: a path prefix whose dirname is
    the folder and basename the file prefix. With ``directory``, that basename is still used
    when the setting points into the same folder.
    """
    env = os.environ if env is None else env
    setting = next((env[k] for k in DUMP_PREFIX_ENVS if env.get(k)), DEFAULT_DUMP_PREFIX)
    setting_path = Path(os.path.expanduser(setting))
    setting_dir, setting_prefix = (setting_path, "") if setting.endswith(os.sep) else (
        setting_path.parent, setting_path.name)
    if directory is None:
        return setting_dir, prefix if prefix is not None else (setting_prefix or None)
    folder = Path(os.path.expanduser(os.fspath(directory)))
    if prefix is None and setting_prefix and _same_dir(folder, setting_dir):
        prefix = setting_prefix
    return folder, prefix


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


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
