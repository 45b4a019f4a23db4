"""Find and read Flight Recorder dumps: safely, tolerantly, fast.

A path may be a directory of per-rank dumps, one file or several. The rank comes
from the file name's trailing number (``nccl_trace_rank_node02_5`` is rank 5), or
from what follows an explicit prefix. Each bad file costs one problem line
("file: what is wrong") and the rest of the job is still read; nothing here
raises on bad input. Pickles go through :mod:`fr_otel.read.safe_pickle`. Large jobs are
read on all cores.
"""

from __future__ import annotations

import gc
import io
import json
import os
import re
import stat
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..common.files import file_kind
from ..common.ranks import compress_ranks
from ..common.text import one_line, printable
from .columns import summarise
from .dump import Entry, Frame, PgConfig, Progress, RankDump
from .live_stack import PAYLOAD_KEY as STACKS_KEY
from .live_stack import stacks_from_raw
from .rank_map import RANKS_FILE, read_rank_map
from .rank_process import PAYLOAD_KEY as PROCESS_KEY
from .rank_process import process_from_raw
from .safe_pickle import (
    DEFAULT_MAX_FILE_BYTES,
    ForbiddenPickle,
    budget_for,
    load_restricted,
    memory_budget,
)
from .steps import PAYLOAD_KEY as STEPS_KEY
from .steps import STEPS_FILE, read_steps_file, step_log_from_raw
from .validate import BadField, EntryFaults, counter, entry_from_raw, int64

if TYPE_CHECKING:
    from ..common.progress import ProgressCallback

__all__ = [
    "ReadResult", "attach_sidecars", "host_from_name", "read_dumps", "read_dump_file", "parse_dump_bytes",
    "rank_from_name",
]

SUPPORTED_MAJOR = 2
_RANK_SUFFIX = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle|pt|bin))?$")
_EXTENSIONS = (".json", ".pkl", ".pickle", ".pt", ".bin")
# Below this many bytes in all, worker start-up costs more than it saves.
_PARALLEL_MIN_BYTES = 16 << 20
_BATCH_FILES = 16


@dataclass(slots=True)
class ReadResult:
    """The dumps that could be read (by rank) and one line per problem met."""

    dumps: dict[int, RankDump] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


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


# What dump file names put around the host: NCCL's and the agent's prefixes, NVRx's ``_dump_``.
_NAME_MARKERS = ("comm_lib", "nccl", "gloo", "fr", "trace", "dump", "rank")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


def host_from_name(path: str) -> str | None:
    """The host a dump file name carries (``nccl_trace_rank_node02_5`` -> ``node02``), or None.

    The rank is the trailing number; what is left once the known prefixes and separators
    are gone is the host, if it is a valid host name (letters, digits, dots, dashes).
    """
    name = os.path.basename(path)
    match = _RANK_SUFFIX.search(name)
    if not match:
        return None
    rest, before = name[: match.start()].strip("_-."), None
    while rest != before:
        before = rest
        for marker in _NAME_MARKERS:
            low = rest.lower()
            if low.startswith(marker) and (len(rest) == len(marker) or rest[len(marker)] in "_-."):
                rest = rest[len(marker):].strip("_-.")
            elif low.endswith(marker) and (len(rest) == len(marker) or rest[-len(marker) - 1] in "_-."):
                rest = rest[: -len(marker)].strip("_-.")
    if not rest or not _HOST.fullmatch(rest) or rest.isdigit():
        return None
    return rest


def _discover(paths: Sequence[str | os.PathLike[str]], prefix: str | None) -> tuple[list[tuple[int, str]], list[str]]:
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
        elif path.is_file() and path.name in _SIDECARS:
            continue  # read by attach_sidecars
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


def _choose_per_rank(found: list[tuple[int, str]], problems: list[str]) -> list[tuple[int, str]]:
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


def read_dumps(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    prefix: str | None = None,
    workers: int | None = None,
    progress: ProgressCallback | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> ReadResult:
    """Read every rank's dump under ``paths``; never raises on bad input.

    ``workers``: processes to parse with (default: all cores, used only when the
    dumps are large enough to repay starting them; 1 = in this process).
    ``progress(files done, files)`` is called as files are parsed.
    ``max_file_bytes``: larger files are refused (one problem line each), not read.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    found, problems = _discover(list(paths), prefix)
    chosen = _choose_per_rank(found, problems)
    result = ReadResult(problems=problems)
    for dump, file_problems in _parse_all(chosen, workers, max_file_bytes, progress):
        result.problems.extend(file_problems)
        if dump is not None:
            result.dumps[dump.rank] = dump
    _check_versions(result)
    attach_sidecars(result, list(paths))
    # File names are anyone's bytes: a newline, ESC or lone surrogate in one must not reach a
    # terminal, a log or strict JSON through the problem lines (text, --json, spans alike).
    result.problems[:] = [printable(p) for p in result.problems]
    return result


_SIDECARS = (RANKS_FILE, STEPS_FILE)


def attach_sidecars(result: ReadResult, paths: Sequence[str | os.PathLike[str]]) -> None:
    """``ranks.json`` and ``steps.json`` beside the dumps fill in what the dump files lack:
    each rank's host and pid, and its training steps."""
    folders = {str(Path(p)) if Path(p).is_dir() else str(Path(p).parent) for p in paths}
    for folder in sorted(folders):
        for name, read, field_name in ((RANKS_FILE, read_rank_map, "process"), (STEPS_FILE, read_steps_file, "steps")):
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                continue
            for rank, value in read(path, result.problems).items():  # type: ignore[operator]
                dump = result.dumps.get(rank)
                if dump is not None and getattr(dump, field_name) is None:
                    setattr(dump, field_name, value)


_Parsed = tuple["RankDump | None", list[str]]


def _parse_all(
    chosen: list[tuple[int, str]], workers: int | None, max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    progress: ProgressCallback | None = None,
) -> list[_Parsed]:
    n_workers = workers if workers is not None else (os.cpu_count() or 1)
    total = 0
    for _, path in chosen:
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    if n_workers <= 1 or len(chosen) < 2 or total < _PARALLEL_MIN_BYTES:
        # Small jobs: build every Entry now, in this process.
        return _parse_batch(chosen, full=total < _PARALLEL_MIN_BYTES, progress=progress, max_bytes=max_bytes)
    n_workers = min(n_workers, len(chosen))
    # Small batches handed out as workers free up: no worker waits on a slow sibling, and
    # results stream back instead of arriving as one big pickle per worker. Workers send
    # columns and tails only; full entries are re-read on demand.
    # This process parses too (one worker fewer: one interpreter less in memory, and its
    # results need no trip through a pipe), taking batches from the end while the pool
    # takes them from the front; a batch the pool already holds cannot be cancelled.
    size = max(1, min(_BATCH_FILES, len(chosen) // (4 * n_workers)))
    batches = [chosen[i : i + size] for i in range(0, len(chosen), size)]
    done: dict[int, list[_Parsed]] = {}

    def advance() -> None:
        if progress is not None:
            progress(sum(len(r) for r in done.values()), len(chosen))

    with ProcessPoolExecutor(max_workers=n_workers - 1) as pool:
        futures = [pool.submit(_parse_batch, batch, False, None, max_bytes) for batch in batches]
        for i in range(len(batches) - 1, -1, -1):
            if not futures[i].cancel():
                break
            done[i] = _parse_batch(batches[i], max_bytes=max_bytes)
            advance()
        pending = {f: i for i, f in enumerate(futures) if i not in done}
        for future in as_completed(pending):
            done[pending[future]] = future.result()
            advance()
    parsed = [item for i in range(len(batches)) for item in done[i]]
    for dump, _ in parsed:
        if dump is not None:
            dump._loader = partial(_load_entries, dump.path, dump.rank, max_bytes)
    return parsed


def _parse_batch(
    batch: list[tuple[int, str]], full: bool = False, progress: ProgressCallback | None = None,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> list[_Parsed]:
    out: list[_Parsed] = []
    # Unpickling allocates millions of short-lived containers and no cycles; the cyclic
    # GC would re-scan the growing heap over and over for nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for rank, path in batch:
            problems: list[str] = []
            out.append((read_dump_file(path, rank, problems, full=full, max_bytes=max_bytes), problems))
            if progress is not None:
                progress(len(out), len(batch))
    finally:
        if was_enabled:
            gc.enable()
    return out


def _load_entries(path: str, rank: int, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> list[Entry] | None:
    dump = read_dump_file(path, rank, [], full=True, max_bytes=max_bytes)
    return dump.entries if dump is not None else None


def read_dump_file(path: str, rank: int, problems: list[str], *, full: bool = True,
                   max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> RankDump | None:
    """Parse one dump file into a :class:`RankDump`; append one line per problem.

    Returns None when the file is unusable (the reason is in ``problems``): not a
    regular file, over ``max_bytes``, or not a dump. Loading may allocate only a small
    multiple of the file's size (:func:`fr_otel.read.safe_pickle.memory_budget`).
    ``full=False`` keeps columns and the tail only; ``entries`` then re-reads the file.
    """
    try:
        # O_NONBLOCK: a FIFO put where a dump should be must not block us until a writer comes.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"{path}: not a regular file ({file_kind(st.st_mode)}); skipped")
                return None
            if st.st_size > max_bytes:
                problems.append(f"{path}: {st.st_size} bytes, over the {max_bytes}-byte limit per dump "
                                "(--max-file-size); skipped")
                return None
            with memory_budget(budget_for(st.st_size)):
                dump = _parse_stream(fh, rank, path, st.st_mtime_ns, problems, full)
    except OSError as exc:
        problems.append(f"{path}: cannot read: {exc.strerror or exc}")
        return None
    if dump is not None and not full:
        dump._loader = partial(_load_entries, path, rank, max_bytes)
    return dump


def parse_dump_bytes(data: bytes, rank: int, source: str = "<memory>", *, dumped_at_ns: int | None = None,
                     problems: list[str] | None = None, full: bool = True) -> RankDump | None:
    """Parse a dump held in memory (e.g. ``torch._C._distributed_c10d._dump_fr_trace()``'s bytes).

    ``full=False`` keeps columns and the tail only (thousands of dumps at once); ``entries``
    then parses ``data`` again. Only the size cap applies here: this runs inside training
    processes, where a process-wide memory limit would be felt by the training threads.
    """
    problems = problems if problems is not None else []
    if len(data) > DEFAULT_MAX_FILE_BYTES:
        problems.append(f"{source}: {len(data)} bytes, over the {DEFAULT_MAX_FILE_BYTES}-byte limit per dump; skipped")
        return None
    dump = _parse_stream(io.BufferedReader(io.BytesIO(data)), rank, source, dumped_at_ns, problems, full)
    if dump is not None and not full:
        dump._loader = partial(_entries_from_bytes, data, rank, source, dumped_at_ns)
    return dump


def _entries_from_bytes(data: bytes, rank: int, source: str, dumped_at_ns: int | None) -> list[Entry] | None:
    dump = parse_dump_bytes(data, rank, source, dumped_at_ns=dumped_at_ns, problems=[])
    return dump.entries if dump is not None else None


def _parse_stream(
    fh: io.BufferedIOBase, rank: int, path: str, mtime: int | None, problems: list[str], full: bool
) -> RankDump | None:
    kind = "corrupt dump"
    try:
        head = fh.peek(1)[:1]  # type: ignore[attr-defined]
        if not head:
            problems.append(f"{path}: empty file")
            return None
        if head == b"\x80":
            kind = "truncated or corrupt pickle"
            raw = load_restricted(fh)
            trailing = fh.read(1)
            if trailing:
                problems.append(f"{path}: data after the end of the pickle (another pickle, or garbage); ignored")
        elif head in (b"{", b" ", b"\n", b"\t", b"\r"):
            kind = "invalid JSON"
            raw = json.load(fh)
        else:
            problems.append(f"{path}: not a Flight Recorder dump (neither a pickle nor JSON)")
            return None
    except ForbiddenPickle as exc:
        problems.append(f"{path}: unsafe pickle: {exc}; nothing was run")
        return None
    except MemoryError:
        problems.append(f"{path}: {kind}: it asks for far more memory than a dump of its size needs; skipped")
        return None
    except RecursionError:
        problems.append(f"{path}: {kind}: nested too deeply; skipped")
        return None
    except OSError as exc:
        problems.append(f"{path}: cannot read: {exc.strerror or exc}")
        return None
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a bad file, not a crash
        # pickle's "truncated" errors are EOF/UnpicklingError/ValueError; JSON's (including
        # Python's 4300-digit integer limit) are ValueErrors: the format decides the words.
        why = one_line(exc)
        if "integer string conversion" in why:  # Python's advice to raise its limit is not the reader's
            why = "a number with thousands of digits (no dump field holds one)"
        problems.append(f"{path}: {kind}: {why}")
        return None
    try:
        return _normalise(raw, rank, path, mtime, problems, full)
    except Exception as exc:  # noqa: BLE001 - a shape we did not foresee is still one line
        problems.append(f"{path}: not a Flight Recorder dump: {type(exc).__name__}: {one_line(exc)}")
        return None


def _normalise(raw: Any, rank: int, path: str, mtime: int | None, problems: list[str], full: bool) -> RankDump | None:
    if not isinstance(raw, dict) or not ({"version", "entries", "pg_status"} & raw.keys()):
        keys = sorted(_text(k)[:40] or type(k).__name__ for k in islice(raw, 20)) if isinstance(raw, dict) else []
        what = f"top-level keys {keys[:5]}" if isinstance(raw, dict) else type(raw).__name__
        problems.append(f"{path}: not a Flight Recorder dump ({what})")
        return None
    version = _text(raw.get("version", ""))
    if not version:
        problems.append(f"{path}: no 'version' key; reading it as a 2.x dump")
    elif not version.startswith(f"{SUPPORTED_MAJOR}."):
        problems.append(f"{path}: dump version {version} is not 2.x; reading it as 2.x may be wrong")
    comm_lib = _text(raw.get("comm_lib_version", raw.get("nccl_version", "")) or "")
    raw_entries = raw.get("entries") or []
    if not isinstance(raw_entries, list):
        problems.append(f"{path}: 'entries' is a {type(raw_entries).__name__}, not a list; ignored")
        raw_entries = []
    backend = _backend(raw_entries, comm_lib)
    gloo = backend == "gloo"
    stacks: dict[tuple[int, ...], tuple[Frame, ...]] = {}
    summary = summarise(raw_entries, gloo)  # None when a column fails validation (fr_otel.read.validate hooks)
    entries: list[Entry] | None = None
    if summary is None or full:
        entries = _entries(raw_entries, gloo, path, problems, stacks)
        if summary is None or len(entries) != len(raw_entries):
            # Some entry is malformed: columns come from the validated (repaired) ones.
            raw_entries = [_as_raw(e) for e in entries]
            summary = summarise(raw_entries, gloo)
            if summary is None:  # pragma: no cover - _as_raw output is always well formed
                problems.append(f"{path}: entries could not be indexed; ignored")
                return None
    if entries is not None:
        tail = [entries[i] for i in summary.tail_index]
    else:
        tail = _entries([raw_entries[i] for i in summary.tail_index], gloo, path, problems, stacks,
                        summary.tail_index)
    created_next = {
        raw_entries[i].get("record_id", -1): raw_entries[i + 1]["time_created_ns"]
        for i in summary.tail_index
        if i + 1 < len(raw_entries)
    }
    return RankDump(
        rank=rank,
        path=path,
        version=version,
        backend=backend,
        comm_lib_version=comm_lib,
        pg_config=_pg_config(raw.get("pg_config"), path, problems),
        pg_status=_pg_status(raw.get("pg_status"), path, problems),
        histories=summary.histories,
        tail=tail,
        entry_count=len(raw_entries),
        fingerprints=summary.fingerprints,
        next_created_ns=created_next,
        latest_ns=summary.latest_ns,
        from_start=summary.from_start,
        has_frames=any(e.frames for e in tail),
        file_mtime_ns=mtime,
        process=process_from_raw(raw.get(PROCESS_KEY), "agent"),
        steps=step_log_from_raw(raw.get(STEPS_KEY)),
        now=stacks_from_raw(raw.get(STACKS_KEY)),
        _entries=entries,
    )


def _text(value: Any) -> str:
    """A name or version from the dump: strings as they are (escaped), numbers as text, anything else empty."""
    if type(value) is str:
        return printable(value)
    return str(value) if int64(value) else ""


def _backend(raw_entries: list[Any], comm_lib: str) -> str:
    for e in raw_entries:
        if isinstance(e, dict) and isinstance(e.get("profiling_name"), str) and ":" in e["profiling_name"]:
            return printable(e["profiling_name"].split(":", 1)[0])
    return "nccl" if comm_lib else "unknown"


_RANKS_SEEN: dict[str, tuple[int, ...] | None] = {}
_RANKS_SEEN_CHARS = 1 << 24  # a bound on the text kept as keys


def _parse_ranks(value: Any) -> tuple[int, ...] | None:
    """``"[0, 1, 4]"`` (or a real list) -> (0, 1, 4); None when not a clean list of ranks.

    Every rank's dump repeats the world group's members (16k numbers at 16k ranks): each
    distinct string is parsed once per process.
    """
    if isinstance(value, str):
        if value in _RANKS_SEEN:
            return _RANKS_SEEN[value]
        if len(value) * (len(_RANKS_SEEN) + 1) > _RANKS_SEEN_CHARS:
            _RANKS_SEEN.clear()
        parsed = _RANKS_SEEN[value] = _parse_ranks_text(value)
        return parsed
    if isinstance(value, (list, tuple)):
        if not all(map(int64, value)):
            return None
        items = list(value)
    else:
        return None
    if any(x < 0 for x in items):
        return None
    return tuple(sorted(set(items)))


def _parse_ranks_text(value: str) -> tuple[int, ...] | None:
    text = value.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    inner = text[1:-1].strip()
    if not inner:
        return ()
    try:
        items = list(map(int, inner.split(",")))
    except ValueError:
        items = _expand_runs(inner)  # fr-otel's own payloads write runs: "[0-16383]"
        if items is None:
            return None
    if min(items) < 0:
        return None
    return tuple(sorted(set(items)))


_MAX_RUN_RANKS = 1 << 24


def _expand_runs(inner: str) -> list[int] | None:
    """``"0-3, 8"`` -> [0, 1, 2, 3, 8]; None unless every item is a rank or an ascending run
    (and the whole stays under 16M ranks: a hostile "0-10**12" is refused, not expanded)."""
    items: list[int] = []
    for part in inner.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            if not dash:
                items.append(int(first))
                continue
            a, b = int(first), int(last)
        except ValueError:
            return None
        if not first or b < a or len(items) + b - a >= _MAX_RUN_RANKS:
            return None
        items.extend(range(a, b + 1))
    return items


def _pg_config(value: Any, path: str, problems: list[str]) -> dict[str, PgConfig]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{path}: 'pg_config' is a {type(value).__name__}, not a mapping; ignored")
        return {}
    out: dict[str, PgConfig] = {}
    for key, cfg in value.items():
        if not isinstance(cfg, dict):
            continue
        name = _text(cfg.get("name", key))
        out[name] = PgConfig(name=name, desc=_text(cfg.get("desc", "")), ranks=_parse_ranks(cfg.get("ranks")))
    return out


def _pg_status(value: Any, path: str, problems: list[str]) -> dict[int, Progress]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{path}: 'pg_status' is a {type(value).__name__}, not a mapping; ignored")
        return {}
    out: dict[int, Progress] = {}
    bad = 0
    for key, st in value.items():
        try:
            out[counter(key)] = Progress(
                enqueued=counter(st["last_enqueued_collective"]),
                started=counter(st.get("last_started_collective", -1)),
                completed=counter(st["last_completed_collective"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            bad += 1
    if bad:
        problems.append(f"{path}: {bad} malformed 'pg_status' item(s) ignored")
    return out


def _entries(
    raw_entries: list[Any], gloo: bool, path: str, problems: list[str],
    stacks: dict[tuple[int, ...], tuple[Frame, ...]], positions: Sequence[int] | None = None,
) -> list[Entry]:
    """Validated :class:`Entry` objects (see :mod:`fr_otel.read.validate`); faults cost one line per kind."""
    entries: list[Entry] = []
    faults = EntryFaults(path)
    append = entries.append
    for index, e in zip(positions if positions is not None else range(len(raw_entries)), raw_entries):
        try:
            append(entry_from_raw(e, index, gloo, faults, stacks))
        except BadField as exc:
            faults.drop(index, str(exc))
    problems.extend(faults.lines())
    return entries


def _as_raw(e: Entry) -> dict[str, Any]:
    """An Entry back in the dump's own shape (for the column builder after a slow-path read)."""
    return {
        "record_id": e.record_id, "pg_id": e.pg_id, "process_group": (e.pg_name, e.pg_desc),
        "collective_seq_id": e.collective_seq_id, "p2p_seq_id": e.p2p_seq_id, "op_id": e.op_id,
        "profiling_name": e.profiling_name, "is_p2p": e.is_p2p, "state": e.state, "retired": e.retired,
        "time_created_ns": e.time_created_ns, "time_discovered_started_ns": e.time_started_ns,
        "time_discovered_completed_ns": e.time_completed_ns, "duration_ms": e.duration_ms,
        "timeout_ms": e.timeout_ms, "input_sizes": [list(x) for x in e.input_sizes],
        "input_dtypes": list(e.input_dtypes), "output_sizes": [list(x) for x in e.output_sizes],
        "output_dtypes": list(e.output_dtypes), "thread_name": e.thread_name, "thread_id": e.thread_id,
        "frames": [{"name": f.name, "filename": f.filename, "line": f.line} for f in e.frames],
    }


def _check_versions(result: ReadResult) -> None:
    by_version: dict[str, list[int]] = {}
    for rank, dump in result.dumps.items():
        by_version.setdefault(dump.version or "?", []).append(rank)
    if len(by_version) > 1:
        parts = "; ".join(f"{v}: {compress_ranks(r)}" for v, r in sorted(by_version.items()))
        result.problems.append(f"mixed dump versions ({parts}): read each by its own version")


