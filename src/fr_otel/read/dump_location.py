"""Where a job writes its Flight Recorder dumps: torch's (and torchcomms') dump-file settings.

NCCL names its automatic dumps ``<TORCH_FR_DUMP_TEMP_FILE><rank>``. ``fr-otel watch`` reads the
same setting to find them; the live agent writes its host map there at start-up, so the
dumps of a node that is lost later still come with every rank's host.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DEFAULT_DUMP_PREFIX", "DUMP_PREFIX_ENVS", "configured_dump_folder", "dump_location"]

#: Where NCCL writes its automatic dumps: the current name first, then the old one; then
#: torchcomms' FlightRecorderHook (JSON, ``<prefix><rank>``, default ``torchcomm_fr_trace_``).
DUMP_PREFIX_ENVS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCHCOMM_FR_DUMP_TEMP_FILE")
DEFAULT_DUMP_PREFIX = "~/.cache/torch/comm_lib_trace_rank_"


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


def configured_dump_folder(env: Mapping[str, str] | None = None) -> Path | None:
    """The folder the job's own dump setting names, or None when none is set (torch's default
    folder is then only a guess, and nothing is written there)."""
    env = os.environ if env is None else env
    if not any(env.get(k) for k in DUMP_PREFIX_ENVS):
        return None
    return dump_location(None, None, env)[0]
