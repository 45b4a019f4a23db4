"""Read a job's Flight Recorder dumps: safely, tolerantly, fast.

Which files are whose is :mod:`fr_otel.read.discovery`'s business; one file is
:mod:`fr_otel.read.dump_file`'s. This module reads them all: each bad file costs one problem
line ("file: what is wrong") and the rest of the job is still read; nothing here raises on
bad input. Large jobs are read on all cores: this process and a pool share the files.
"""

from __future__ import annotations

import gc
import os
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Sequence

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]  # the optional-module idiom: _widen_result_pipe then does nothing

from ..common.cpus import usable_cpus
from ..common.gc_pause import gc_paused
from ..common.ranks import compress_ranks
from ..common.text import printable
from .discovery import choose_per_rank, discover, node_folders
from .dump import RankDump
from .dump_file import load_entries, read_dump_file
from .safe_pickle import DEFAULT_MAX_FILE_BYTES
from .sidecars import SideFacts, read_sidecars

if TYPE_CHECKING:
    from ..common.progress import ProgressCallback

__all__ = ["ReadResult", "read_dumps"]

# Below this many bytes in all, worker start-up costs more than it saves.
_PARALLEL_MIN_BYTES = 16 << 20
# Files per batch handed to a pool worker at most (fewer as the work runs out): each round trip
# waits for this process's result thread, which waits for the GIL while this process parses.
_BATCH_FILES = 8
# A worker's result (~40 KiB per 2000-entry dump) goes through a pipe that this process drains
# only when its result thread gets the GIL: in the default 64 KiB pipe a worker waited ~4 ms per
# batch, ~20% of its time. Linux lets an unprivileged pipe grow to 1 MiB (fs/pipe-max-size).
_RESULT_PIPE_BYTES = 1 << 20


@dataclass(slots=True)
class ReadResult:
    """The dumps that could be read (by rank), what the files beside them add, and one line per problem met."""

    dumps: dict[int, RankDump] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    side: SideFacts = field(default_factory=SideFacts)


def read_dumps(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    prefix: str | None = None,
    workers: int | None = None,
    progress: ProgressCallback | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> ReadResult:
    """Read every rank's dump under ``paths``; never raises on bad input.

    ``workers``: processes to parse with (default: every CPU this process may use, used only when the
    dumps are large enough to repay starting them; 1 = in this process).
    ``progress(files done, files)`` is called as files are parsed.
    ``max_file_bytes``: larger files are refused (one problem line each), not read.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = node_folders(list(paths), prefix)  # one incident's node folders copied into one: each read as its own
    found, problems = discover(paths, prefix)
    chosen = choose_per_rank(found, problems)
    result = ReadResult(problems=problems)
    for dump, file_problems in _parse_all(chosen, workers, max_file_bytes, progress):
        result.problems.extend(file_problems)
        if dump is not None:
            result.dumps[dump.rank] = dump
    _check_versions(result)
    result.side = read_sidecars(paths, result.dumps, result.problems)
    # File names are anyone's bytes: a newline, ESC or lone surrogate in one must not reach a
    # terminal, a log or strict JSON through the problem lines (text, --json, spans alike).
    result.problems[:] = [printable(p) for p in result.problems]
    return result


_Parsed = tuple["RankDump | None", list[str]]


def _parse_all(
    chosen: list[tuple[int, str]], workers: int | None, max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    progress: ProgressCallback | None = None,
) -> list[_Parsed]:
    n_workers = workers if workers is not None else usable_cpus()
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
    # This process parses too (one worker fewer: one interpreter less in memory, and its results
    # need no trip through a pipe), one file at a time from the end, while the pool takes small
    # batches from the front. The pool is handed only a couple of batches ahead (a batch it holds
    # cannot be taken back), shrinking as the two ends near: where they meet, nobody waits long.
    front, back = 0, len(chosen)
    done: dict[int, list[_Parsed]] = {}  # first file index -> parsed files
    ahead = 2 * (n_workers - 1)
    finished = 0

    def advance(files: int) -> None:
        nonlocal finished
        finished += files
        if progress is not None:
            progress(finished, len(chosen))

    with gc_paused(), ProcessPoolExecutor(max_workers=n_workers - 1) as pool:  # results arrive meanwhile
        _widen_result_pipe(pool)
        running: dict[Future[list[_Parsed]], int] = {}
        while True:
            for future in [f for f in running if f.done()]:
                done[running.pop(future)] = parsed = future.result()
                advance(len(parsed))
            while front < back - 1 and len(running) < ahead:  # the last file is always this process's
                size = max(1, min(_BATCH_FILES, (back - front) // (2 * n_workers * ahead)))
                running[pool.submit(_parse_batch, chosen[front : front + size], False, None, max_bytes)] = front
                front += size
            if front >= back:
                break
            back -= 1
            done[back] = _parse_batch([chosen[back]], max_bytes=max_bytes)
            advance(1)
        for future in as_completed(running):
            done[running[future]] = parsed = future.result()
            advance(len(parsed))
    results = [item for i in sorted(done) for item in done[i]]
    for dump, _ in results:
        if dump is not None:
            dump.load_entries_with(partial(load_entries, dump.path, dump.rank, max_bytes))
    return results


def _widen_result_pipe(pool: ProcessPoolExecutor) -> None:
    """Give the workers' result pipe room for a few batches, so a worker goes on parsing instead
    of waiting for this process to read. Speed only: where the pipe or the call is missing (not
    Linux, another Python's private layout, a lower pipe-max-size), the default pipe stays."""
    try:  # the ignore: _result_queue is CPython's private attribute, in no stub
        fcntl.fcntl(pool._result_queue._writer.fileno(), fcntl.F_SETPIPE_SZ, _RESULT_PIPE_BYTES)  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        pass


def _parse_batch(
    batch: list[tuple[int, str]], full: bool = False, progress: ProgressCallback | None = None,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> list[_Parsed]:
    out: list[_Parsed] = []
    with gc_paused():
        for rank, path in batch:
            problems: list[str] = []
            out.append((read_dump_file(path, rank, problems, full=full, max_bytes=max_bytes), problems))
            # A hostile pickle can hold cycles (a list that holds itself), which only the collector
            # frees: one young-generation pass per file keeps memory bounded by one file, not by all
            # of them (a pool worker is forked while the collector is paused and never resumes it).
            gc.collect(0)
            if progress is not None:
                progress(len(out), len(batch))
    return out


def _check_versions(result: ReadResult) -> None:
    by_version: dict[str, list[int]] = {}
    for rank, dump in result.dumps.items():
        by_version.setdefault(dump.version or "?", []).append(rank)
    if len(by_version) > 1:
        parts = "; ".join(f"{v}: {compress_ranks(r)}" for v, r in sorted(by_version.items()))
        result.problems.append(f"mixed dump versions ({parts}): read each by its own version")
