"""One Flight Recorder dump, from a file or from bytes, as a :class:`~fr_otel.read.dump.RankDump`.

Pickle (through :mod:`fr_otel.read.safe_pickle`: nothing in it runs) or JSON. A bad dump is
one problem line ("file: what is wrong") and None, never an exception. Entries are checked by
:mod:`fr_otel.read.validate`; with ``full=False`` only the columns (:mod:`fr_otel.read.columns`)
and the tail are kept, and the entries are parsed again when asked for. Reading a whole job,
on every core, is :mod:`fr_otel.read.reader`'s.
"""

from __future__ import annotations

import io
import json
from functools import partial
from itertools import islice
from typing import Any, Sequence

from ..common.files import NotRegularFile, open_regular
from ..common.text import one_line
from .columns import summarise
from .dump import Entry, RankDump
from .entry_rules import backend_of
from .failed import PAYLOAD_KEY as FAILED_KEY
from .failed import failed_from_raw
from .frame import Frame
from .live_stack import PAYLOAD_KEY as STACKS_KEY
from .live_stack import stacks_from_raw
from .rank_facts import EXIT_KEY, HOST_VIEW_KEY, exit_from_raw, host_view_from_raw
from .pg_meta import dump_text, pg_config, pg_status
from .last_record import RECORD_KEY, record_from_raw
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
from .steps import step_log_from_raw
from .validate import BadField, EntryFaults, entry_from_raw

__all__ = ["SUPPORTED_MAJOR", "load_entries", "parse_dump_bytes", "raw_entry", "read_dump_file"]

#: The dump format's major version this reader knows (others are read as it, with a warning).
SUPPORTED_MAJOR = 2
# The C unpickler peeks 128 KiB ahead, then reads what it consumed: with the default 8 KiB
# buffer every 8 KiB costs a peek, a read and a system call (~5% of a 2000-entry dump's load).
_READ_BUFFER_BYTES = 1 << 16


def load_entries(path: str, rank: int, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> list[Entry] | None:
    """Every entry of a dump first read with ``full=False``: the file is parsed again, on demand."""
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
        fd, st = open_regular(path)  # a FIFO put where a dump should be must not block us
        with io.BufferedReader(io.FileIO(fd, "rb"), _READ_BUFFER_BYTES) as fh:  # open()'s own, typed
            if st.st_size > max_bytes:
                problems.append(f"{path}: {st.st_size} bytes, over the {max_bytes}-byte limit per dump "
                                "(--max-file-size); skipped")
                return None
            with memory_budget(budget_for(st.st_size)):
                dump = _parse_stream(fh, rank, path, st.st_mtime_ns, problems, full)
    except NotRegularFile as exc:
        problems.append(f"{path}: not a regular file ({exc.kind}); skipped")
        return None
    except OSError as exc:
        problems.append(f"{path}: cannot read: {exc.strerror or exc}")
        return None
    if dump is not None and not full:
        dump.load_entries_with(partial(load_entries, path, rank, max_bytes))
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
        dump.load_entries_with(partial(_entries_from_bytes, data, rank, source, dumped_at_ns))
    return dump


def _entries_from_bytes(data: bytes, rank: int, source: str, dumped_at_ns: int | None) -> list[Entry] | None:
    dump = parse_dump_bytes(data, rank, source, dumped_at_ns=dumped_at_ns, problems=[])
    return dump.entries if dump is not None else None


def _parse_stream(
    fh: io.BufferedReader[Any], rank: int, path: str, mtime: int | None, problems: list[str], full: bool
) -> RankDump | None:
    kind = "corrupt dump"
    try:
        head = fh.peek(1)[:1]
        if not head:
            problems.append(f"{path}: empty file")
            return None
        if head == b"\x80":
            kind = "truncated or corrupt pickle"
            data = fh.read()
            raw, used = load_restricted(data)
            if used < len(data):
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
        keys = sorted(dump_text(k)[:40] or type(k).__name__ for k in islice(raw, 20)) if isinstance(raw, dict) else []
        what = f"top-level keys {keys[:5]}" if isinstance(raw, dict) else type(raw).__name__
        problems.append(f"{path}: not a Flight Recorder dump ({what})")
        return None
    version = dump_text(raw.get("version", ""))
    if not version:
        problems.append(f"{path}: no 'version' key; reading it as a 2.x dump")
    elif not version.startswith(f"{SUPPORTED_MAJOR}."):
        problems.append(f"{path}: dump version {version} is not 2.x; reading it as 2.x may be wrong")
    comm_lib = dump_text(raw.get("comm_lib_version", raw.get("nccl_version", "")) or "")
    raw_entries = raw.get("entries") or []
    if not isinstance(raw_entries, list):
        problems.append(f"{path}: 'entries' is a {type(raw_entries).__name__}, not a list; ignored")
        raw_entries = []
    backend = backend_of(raw_entries, comm_lib)
    gloo = backend == "gloo"
    stacks: dict[tuple[int, ...], tuple[Frame, ...]] = {}
    summary = summarise(raw_entries, gloo)  # None when a column fails validation (fr_otel.read.validate hooks)
    entries: list[Entry] | None = None
    if summary is None or full:
        entries = _entries(raw_entries, gloo, path, problems, stacks)
        if summary is None or len(entries) != len(raw_entries):
            # Some entry is malformed: columns come from the validated (repaired) ones.
            raw_entries = [raw_entry(e) for e in entries]
            summary = summarise(raw_entries, gloo)
            if summary is None:  # pragma: no cover - raw_entry output is always well formed
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
    dump = RankDump(
        rank=rank,
        path=path,
        version=version,
        backend=backend,
        comm_lib_version=comm_lib,
        pg_config=pg_config(raw.get("pg_config"), path, problems),
        pg_status=pg_status(raw.get("pg_status"), path, problems),
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
        host_view=host_view_from_raw(raw.get(HOST_VIEW_KEY)),
        exit=exit_from_raw(raw.get(EXIT_KEY)),
        record=record_from_raw(raw.get(RECORD_KEY)),
    )
    dump.set_entries(entries)
    for mark in failed_from_raw(raw.get(FAILED_KEY)):
        dump.mark_failed(mark)
    return dump


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


def raw_entry(e: Entry) -> dict[str, Any]:
    """An Entry back in the dump's own shape (for the column builder after a slow-path read, and a
    node summary's few whole entries)."""
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
