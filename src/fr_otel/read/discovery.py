"""Which files are dumps, and whose: ranks (and hosts) from file names, one file per rank.

A path may be a directory of per-rank dumps, one file or several. The rank comes from the
file name's trailing number (``nccl_trace_rank_node02_5`` is rank 5), or from what follows an
explicit prefix; side files named on the command line are left to :mod:`.sidecars`. Every path that cannot be used costs one problem line, never an exception.
"""

from __future__ import annotations

import os
import re
import shlex
from itertools import islice
from pathlib import Path
from typing import Sequence

from ..common.names import host_name
from .incident_file import INCIDENT_FILE
from .side_files import read_side_file, side_file_present
from .sidecars import SIDECARS

__all__ = ["choose_per_rank", "discover", "host_from_name", "node_folders", "rank_from_name"]

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
                with os.scandir(path) as listing:
                    entries = {entry.name: _is_dir(entry) for entry in listing}
            except OSError as exc:
                problems.append(f"{path}: cannot list: {exc.strerror or exc}")
                continue
            names = sorted(entries)
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
                problems.append(_no_dumps(path, entries, prefix))
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


def node_folders(paths: Sequence[str | os.PathLike[str]], prefix: str | None = None) -> list[str | os.PathLike[str]]:
    """``paths`` with each folder of node folders replaced by those folders: one incident copied off its nodes.

    Each node keeps its own dumps and side files (``ranks.json``, ``steps.json``, ``incident.json``),
    so copying them into one folder keeps one subfolder per node (``incident/node0/``, ...). A folder is
    taken as such when it holds no dump of its own and the incident files of its subfolders with dumps
    all name one trace id; a folder of several incidents (the agent's ``dumps/``) is left as it is, and
    says which subfolders to pass."""
    out: list[str | os.PathLike[str]] = []
    for raw in paths:
        path = Path(raw)
        subfolders = _node_subfolders(path, prefix) if path.is_dir() else None
        out.extend(subfolders if subfolders else [raw])
    return out


def _node_subfolders(path: Path, prefix: str | None) -> list[str] | None:
    try:
        with os.scandir(path) as listing:
            entries = {entry.name: _is_dir(entry) for entry in islice(listing, _MAX_NAMES_READ)}
    except OSError:
        return None
    if any(not is_dir and rank_from_name(n, prefix) is not None and n not in SIDECARS for n, is_dir in entries.items()):
        return None
    held = [n for n, _ in _dump_subfolders(path, sorted(n for n, is_dir in entries.items() if is_dir), prefix)]
    traces: set[object] = set()
    for name in held:
        incident = path / name / INCIDENT_FILE
        if side_file_present(str(incident)):
            raw = read_side_file(str(incident), [], "ignored")
            traces.add(raw.get("trace_id") if raw is not None else None)
    if len(traces) != 1 or None in traces:
        return None
    return [str(path / name) for name in held]


MAX_NAMES_SHOWN = 6
#: Subfolders of a folder without dumps looked into (names only) to say which hold dumps.
MAX_SUBFOLDERS = 256
_MAX_NAMES_READ = 100_000  # per subfolder: a listing is never read without end


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """A folder (through links); a looping or unreadable link is not (its own problem line says why)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _no_dumps(path: Path, entries: dict[str, bool], prefix: str | None) -> str:
    """Why a folder gave no dump, and what would: the names it holds (and the prefix they share),
    or the subfolders that hold dumps (a parent folder, or a folder of several incidents)."""
    wanted = f"starts with {prefix!r} and ends in a rank number" if prefix else "ends in a rank number"
    text = f"{path}: no dump files (no file name {wanted})"
    files = [n for n, is_dir in sorted(entries.items()) if not is_dir and n not in SIDECARS]
    if files:
        shown = ", ".join(files[:MAX_NAMES_SHOWN]) + (f", … ({len(files)} files)" if len(files) > MAX_NAMES_SHOWN
                                                      else "")
        text += f"; file names seen: {shown}"
        stems = {n[: m.start()] for n in files if rank_from_name(n) is not None and (m := _RANK_SUFFIX.search(n))}
        if prefix is not None and len(stems) == 1:
            (stem,) = stems
            text += f"; they would be dumps with --prefix {shlex.quote(stem)}" if stem else \
                "; they would be dumps without --prefix"
    held = _dump_subfolders(path, [n for n, is_dir in sorted(entries.items()) if is_dir], prefix)
    if held:
        listed = ", ".join(f"{n}/ ({k} dump file{'s' if k != 1 else ''})" for n, k in held[:MAX_NAMES_SHOWN])
        more = f", … ({len(held)} subfolders)" if len(held) > MAX_NAMES_SHOWN else ""
        text += (f"; subfolders with dumps: {listed}{more}: pass one of them (one incident each), "
                 f"e.g. {shlex.quote(str(path / held[0][0]))}")
    return text


def _dump_subfolders(path: Path, subfolders: list[str], prefix: str | None) -> list[tuple[str, int]]:
    """(name, dump files by name) of each subfolder whose file names claim ranks: names only, bounded."""
    out = []
    for name in subfolders[:MAX_SUBFOLDERS]:
        try:
            with os.scandir(path / name) as listing:
                claims = sum(1 for entry in islice(listing, _MAX_NAMES_READ)
                             if rank_from_name(entry.name, prefix) is not None and entry.name not in SIDECARS)
        except OSError:
            continue
        if claims:
            out.append((name, claims))
    return out


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
