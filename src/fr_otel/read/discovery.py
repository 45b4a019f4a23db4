"""Which files are dumps, and whose: ranks (and hosts) from file names, one file per rank.

A path may be a directory of per-rank dumps, one file or several. The rank comes from the
file name's trailing number (``nccl_trace_rank_node02_5`` is rank 5), or from what follows an
explicit prefix; side files named on the command line are left to :mod:`.sidecars`. Every path that cannot be used costs one problem line, never an exception.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

from ..common.names import host_name
from .sidecars import SIDECARS

__all__ = ["choose_per_rank", "discover", "host_from_name", "rank_from_name"]

_RANK_SUFFIX = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle|pt|bin))?$")
_EXTENSIONS = (".json", ".pkl", ".pickle", ".pt", ".bin")
def rank_from_name(name: str, prefix: str | None = None) -> int | None:
    """The rank a dump file name claims, or None if it claims none.

    Without a prefix the trailing number wins, so host names embedded in the
    prefix (``..._node02_5``) do not confuse it. With a prefix, the name must
    start with it and the rest must be the rank.
    """
    if prefix is not None:
        if not name.startswith(prefix):
            return None
        rest = name[len(prefix):]
        for ext in _EXTENSIONS:
            if rest.endswith(ext):
                rest = rest[: -len(ext)]
                break
        return int(rest) if rest.isdigit() else None
    match = _RANK_SUFFIX.search(name)
    return int(match.group(1)) if match else None


# What dump file names put around the host: NCCL's, torchcomms' and the agent's prefixes, NVRx's ``_dump_``.
_NAME_MARKERS = ("torchcomms", "torchcomm", "comm_lib", "nccl", "gloo", "fr", "trace", "dump", "rank")


def host_from_name(path: str) -> str | None:
    """The host a dump file name carries (``nccl_trace_rank_node02_5`` -> ``node02``), or None.

    The rank is the trailing number; the host is what is left beside a recorder's known
    prefix (``nccl_trace_rank``, ``comm_lib_trace_rank``, ``torchcomm_fr_trace``...) once
    that prefix and the separators are gone, if it is a host name
    (:data:`fr_otel.common.names.HOST_NAME`). A name with no known prefix carries no host:
    its prefix is a prefix (``mytrace_3``), and torchcomms' names (``torchcomm_fr_trace_3``)
    are prefix and rank only.
    """
    name = os.path.basename(path)
    match = _RANK_SUFFIX.search(name)
    if not match:
        return None
    rest, before, stripped = name[: match.start()].strip("_-."), None, False
    while rest != before:
        before = rest
        for marker in _NAME_MARKERS:
            low = rest.lower()
            if low.startswith(marker) and (len(rest) == len(marker) or rest[len(marker)] in "_-."):
                rest, stripped = rest[len(marker):].strip("_-."), True
            elif low.endswith(marker) and (len(rest) == len(marker) or rest[-len(marker) - 1] in "_-."):
                rest, stripped = rest[: -len(marker)].strip("_-."), True
    if not stripped or rest.isdigit():
        return None
    return host_name(rest)


def discover(paths: Sequence[str | os.PathLike[str]], prefix: str | None) -> tuple[list[tuple[int, str]], list[str]]:
    """(rank, path) of every file that claims a rank, and one line per path that cannot be used."""
    found: list[tuple[int, str]] = []
    problems: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            try:
                names = sorted(entry.name for entry in os.scandir(path))
            except OSError as exc:
                problems.append(f"{path}: cannot list: {exc.strerror or exc}")
                continue
            ranked: list[tuple[int, str]] = []
            for name in names:
                rank = rank_from_name(name, prefix)
                if rank is None:
                    continue
                child = path / name
                if child.is_file():
                    ranked.append((rank, str(child)))
                elif not child.is_dir():  # sub-folders (e.g. per-incident ones) are not dumps
                    problems.append(f"{child}: not a regular file (a FIFO, device, socket or broken or looping "
                                    "link); skipped")
            if not ranked:
                wanted = f"starts with {prefix!r} and ends in a rank number" if prefix else "ends in a rank number"
                problems.append(f"{path}: no dump files (no file name {wanted})")
            found.extend(ranked)
        elif path.is_file() and path.name in SIDECARS:
            continue  # read by read_sidecars
        elif path.is_file():
            rank = rank_from_name(path.name, prefix)
            if rank is None:
                problems.append(f"{path}: cannot tell the rank: the file name does not end in a rank number")
            else:
                found.append((rank, str(path)))
        elif path.exists():
            problems.append(f"{path}: not a regular file or directory")
        else:
            problems.append(f"{path}: no such file or directory")
    return found, problems


def choose_per_rank(found: list[tuple[int, str]], problems: list[str]) -> list[tuple[int, str]]:
    """One file per rank; pickles (they carry stacks) win over JSON, then name order."""
    by_rank: dict[int, list[str]] = {}
    for rank, path in found:
        by_rank.setdefault(rank, []).append(path)
    chosen: list[tuple[int, str]] = []
    for rank in sorted(by_rank):
        candidates = sorted(set(by_rank[rank]), key=lambda p: (p.endswith(".json"), p))
        if len(candidates) > 1:
            others = ", ".join(candidates[1:])
            problems.append(f"{candidates[0]}: rank {rank} is also claimed by {others}; using {candidates[0]}")
        chosen.append((rank, candidates[0]))
    return chosen
