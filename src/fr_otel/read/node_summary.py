"""A node's ranks in one compact record: what a node leader sends the incident's coordinator.

At 100k ranks one coordinator cannot decode 100k payloads (~1 ms each: inflate, unpickle, a
column scan). So each node's leader decodes its own ranks' payloads (the same
:func:`fr_otel.agent.observe.payload.decode_payload`) and keeps, of each rank, exactly what the cross-rank
analysis reads: the per-group columns (sequence numbers, completion flags, enqueue times, call
fingerprints, send/recv channels) as raw bytes, the counters, the groups and their members, where
the rank runs, its training steps over the span of its columns, its failed collectives, how it left
(its exit record), the node's ranks as ``/proc`` showed them (one read each, the newest), and the
few whole entries the verdict looks at (every one in flight, the newest of each group, and the
completed one that ran longest: the job's pace is the longest run seen). The coordinator rebuilds
a :class:`~fr_otel.read.dump.RankDump` from that in ~0.4 ms of CPU (bench_scale), marked ``compact``:
the analysis gives the verdict it gives on the full payloads, and the ranks the verdict names are
fetched in full afterwards (their stacks, every entry). A summary may carry such full payloads
itself (``full``): the leader adds them for ranks that stand out on their node.

Untrusted like any dump: loaded with the restricted unpickler, every column checked
(lengths, flags, signs, text), every call's id recomputed from the call; a bad
rank record is one problem line and is left out, never an exception.
"""

from __future__ import annotations

import pickle
import struct
import sys
import zlib
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from ..common.inflate import InflatedTooLarge, inflate
from ..common.names import host_name
from ..common.text import one_line, printable
from .columns import fingerprint_id
from .dump import Entry, GroupHistory, P2PChannel, PgConfig, Progress, RankDump
from .dump_file import raw_entry
from .failed import failed_from_raw
from .rank_facts import ProcessFacts, exit_from_raw, host_view_from_raw, merge_facts
from .frame import Frame
from .pg_meta import dump_text, member_runs, pg_config
from .rank_process import process_from_raw
from .safe_pickle import ForbiddenPickle, load_restricted
from .steps import RING, StepLog, StepStarts
from .validate import (
    BadField,
    EntryFaults,
    counter,
    entry_from_raw,
    fingerprint_ok,
    int64,
)

__all__ = ["MAX_SUMMARY_BYTES", "NodeSummary", "compact_tail", "decode_node_summary", "encode_node_summary"]

_MAGIC = b"FRN1"
_HEADER = struct.Struct(">4sQ")
#: A node summary larger than this (inflated) is refused: 8 ranks' columns are tens of KB.
MAX_SUMMARY_BYTES = 64 << 20
_MAX_TAIL = 4096
_BIG_ENDIAN = sys.byteorder == "big"


@dataclass(slots=True)
class NodeSummary:
    """One node's part of an incident, as its leader sent it."""

    host: str
    leader: int
    made_ns: int
    dumps: dict[int, RankDump] = field(default_factory=dict)  # compact, one per rank the leader had
    full: dict[int, bytes] = field(default_factory=dict)  # whole payloads of the ranks that stand out
    heard: dict[int, int] = field(default_factory=dict)  # rank -> when its leader last heard from it (wall ns)


# --------------------------------------------------------------------------- the leader's side


def compact_tail(dump: RankDump, longest: bool = True) -> list[Entry]:
    """The whole entries a compact rank keeps (record order): every one in flight, its newest (what
    an idle rank last did), and (``longest``) the completed one that ran longest: the job's pace is
    the longest run of all, so of a node only the rank that holds the node's longest keeps it."""
    keep = {i for i, e in enumerate(dump.tail) if not e.completed}
    if dump.tail:
        keep.add(len(dump.tail) - 1)
    run = _longest_run(dump)
    if longest and run is not None:
        keep.add(run[1])
    return [dump.tail[i] for i in sorted(keep)]


def _longest_run(dump: RankDump) -> tuple[int, int] | None:
    """(run ns, tail index) of the completed tail entry that ran longest."""
    runs = [(e.time_completed_ns - e.time_created_ns, i) for i, e in enumerate(dump.tail)
            if e.completed and e.time_completed_ns and e.time_completed_ns >= e.time_created_ns]
    return max(runs) if runs else None


def _column(col: Any) -> bytes:
    """An int64 column as little-endian bytes (whatever this host's byte order)."""
    out = col if type(col) is array else array("q", col)
    if _BIG_ENDIAN:
        out = array("q", out)
        out.byteswap()
    return out.tobytes()


def _steps_since(steps: StepLog | None, oldest_ns: int) -> list[Any] | None:
    """The step log from the step running at ``oldest_ns`` on (every step a kept time falls in), as
    [step, source, steps column, start times column]."""
    if steps is None:
        return None
    i = bisect_right([s[1] for s in steps.starts], oldest_ns)
    kept = steps.starts[max(i - 1, 0):]
    return [steps.step, steps.source, _column([s for s, _ in kept]), _column([t for _, t in kept])]


def _rank_record(dump: RankDump, configs: dict[tuple[Any, ...], int], calls: dict[int, tuple[Any, ...]],
                 stacks: dict[tuple[Frame, ...], list[dict[str, Any]]], longest: bool) -> dict[str, Any]:
    histories = []
    oldest = dump.latest_ns
    for h in dump.histories.values():
        seq: Any = [h.seq.start, h.seq.stop] if isinstance(h.seq, range) and h.contiguous else _column(h.seq)
        p2p = [[name, ch.done, _column(ch.created_ns), _column(ch.fingerprint)] for name, ch in h.p2p.items()]
        histories.append([h.name, h.desc, h.local_id, seq, h.completed, _column(h.created_ns), _column(h.fingerprint),
                          h.p2p_count, p2p])
        for fid in (*h.fingerprint, *(f for ch in h.p2p.values() for f in ch.fingerprint)):
            if fid not in calls:
                calls[fid] = dump.fingerprints[fid]
        times = [t for t in (*h.created_ns, *(t for ch in h.p2p.values() for t in ch.created_ns)) if t > 0]
        oldest = min(oldest, min(times, default=oldest))
    tail = compact_tail(dump, longest)
    oldest = min(oldest, min((e.time_created_ns for e in tail if e.time_created_ns > 0), default=oldest))
    config = tuple(sorted((c.name, c.desc, c.ranks) for c in dump.pg_config.values()))
    return {
        "rank": dump.rank, "version": dump.version, "backend": dump.backend, "comm": dump.comm_lib_version,
        "entries": dump.entry_count, "latest": dump.latest_ns, "from_start": dump.from_start,
        "has_frames": dump.has_frames, "pg": configs.setdefault(config, len(configs)),
        "status": [[slot, p.enqueued, p.started, p.completed] for slot, p in dump.pg_status.items()],
        "histories": histories, "tail": [_raw(e, stacks) for e in tail],
        "process": dump.process.as_json() if dump.process is not None else None,
        "steps": _steps_since(dump.steps, oldest),
        "failed": [m.as_json() for m in dump.failed],
        "exit": dump.exit.as_json() if dump.exit is not None else None,
    }


def _raw(e: Entry, stacks: dict[tuple[Frame, ...], list[dict[str, Any]]]) -> dict[str, Any]:
    """The entry in the dump's shape; one stack object per distinct stack, so the pickle holds it once
    and the coordinator validates it once."""
    raw = raw_entry(e)
    raw["frames"] = stacks.setdefault(e.frames, raw["frames"])
    return raw


def encode_node_summary(host: str, leader: int, made_ns: int, dumps: dict[int, RankDump], *,
                        full: dict[int, bytes] | None = None, heard: dict[int, int] | None = None) -> bytes:
    """The node's ranks, compact, with the whole payloads of ``full`` and when each was last heard."""
    configs: dict[tuple[Any, ...], int] = {}
    calls: dict[int, tuple[Any, ...]] = {}
    stacks: dict[tuple[Frame, ...], list[dict[str, Any]]] = {}
    runs = {r: run for r, run in ((r, _longest_run(d)) for r, d in dumps.items()) if run is not None}
    longest = max(runs, key=lambda r: (runs[r][0], -r), default=None)
    ranks = [_rank_record(d, configs, calls, stacks, r == longest) for r, d in sorted(dumps.items())]
    groups = [{name: {"name": name, "desc": desc, "ranks": "[" + member_runs(members) + "]" if members is not None else None}
               for name, desc, members in config} for config in configs]
    view: dict[int, ProcessFacts] = {}  # the node's ranks as /proc showed them: the newest read of each
    for d in dumps.values():
        for rank, facts in d.host_view.items():
            view[rank] = merge_facts(view.get(rank), facts)
    body = {"fr_otel_node_summary": 1, "host": host, "leader": leader, "made_ns": made_ns, "groups": groups,
            "host_view": {str(r): f.as_json() for r, f in sorted(view.items())},
            "calls": [[fid, *call] for fid, call in calls.items()], "ranks": ranks,
            "heard": dict(heard or {}), "full": dict(full or {})}
    return _HEADER.pack(_MAGIC, made_ns) + zlib.compress(pickle.dumps(body, protocol=4), 1)


# --------------------------------------------------------------------------- the coordinator's side


def decode_node_summary(blob: bytes, source: str, problems: list[str],
                        shared: dict[tuple[Any, ...], Any] | None = None) -> NodeSummary | None:
    """A node summary from the store; None (and one problem line) when it is unusable. A rank record
    that fails a check is one problem line and is left out. Columns equal byte for byte (every member
    of a group made the same calls) are one object, across the summaries that share ``shared``."""
    if len(blob) < _HEADER.size or _HEADER.unpack_from(blob)[0] != _MAGIC:
        problems.append(f"{source}: not an fr-otel node summary")
        return None
    try:
        body = inflate(blob[_HEADER.size:], MAX_SUMMARY_BYTES)
        raw, used = load_restricted(body)
        if used != len(body):
            raise ValueError(f"{len(body) - used} bytes after the summary")
    except InflatedTooLarge:
        problems.append(f"{source}: over {MAX_SUMMARY_BYTES} bytes inflated; skipped")
        return None
    except (zlib.error, ForbiddenPickle, MemoryError, RecursionError, EOFError, pickle.UnpicklingError,
            ValueError, TypeError) as exc:
        problems.append(f"{source}: corrupt node summary: {one_line(exc)}")
        return None
    shared = shared if shared is not None else {}
    if not isinstance(raw, dict) or raw.get("fr_otel_node_summary") != 1:
        problems.append(f"{source}: not an fr-otel node summary (format {type(raw).__name__})")
        return None
    host = host_name(raw.get("host")) or ""
    leader, made = raw.get("leader"), raw.get("made_ns")
    out = NodeSummary(host, leader if type(leader) is int and leader >= 0 else -1,
                      made if int64(made) and made >= 0 else 0)
    try:
        calls = _calls(raw.get("calls"))
        configs = [_shared_config(pg_config(g, source, problems), shared) for g in _list(raw.get("groups"))]
    except (TypeError, ValueError) as exc:
        problems.append(f"{source}: {one_line(exc)}; skipped")
        return None
    stacks: dict[tuple[int, ...], tuple[Frame, ...]] = {}  # by identity: valid while ``raw`` lives
    checked: set[int] = set()  # columns (by identity) this summary's calls define
    bad: list[str] = []
    for record in _list(raw.get("ranks")):
        try:
            dump = _rank_dump(record, source, calls, configs, stacks, shared, checked, problems)
        except (KeyError, TypeError, ValueError, IndexError, OverflowError, BadField) as exc:
            rank = record.get("rank") if isinstance(record, dict) else None
            bad.append(f"{rank if type(rank) is int else '?'} ({one_line(exc, 80)})")
            continue
        out.dumps[dump.rank] = dump
    if bad:
        problems.append(f"{source}: {len(bad)} rank record(s) unusable, left out: {', '.join(bad[:4])}")
    view = host_view_from_raw(raw.get("host_view"))  # drops what is ill-typed, never raises (fuzzed)
    if view and out.dumps:  # the node's view travels with one of its dumps (the job model merges every dump's)
        out.dumps[min(out.dumps)].host_view = view
    heard, full = raw.get("heard"), raw.get("full")
    for rank, ns in heard.items() if isinstance(heard, dict) else ():
        if int64(rank) and rank >= 0 and int64(ns) and ns > 0:
            out.heard[rank] = ns
    for rank, payload in full.items() if isinstance(full, dict) else ():
        if int64(rank) and rank >= 0 and type(payload) is bytes:
            out.full[rank] = payload
    return out


def _shared_config(config: dict[str, PgConfig], shared: dict[tuple[Any, ...], Any]) -> dict[str, PgConfig]:
    """One object per group (its members parsed once: ``parse_ranks``), one mapping per distinct set of
    groups: a coordinator holds 100k ranks' configs as a few thousand objects."""
    kept = {name: shared.setdefault(("pg", cfg.name, cfg.desc, id(cfg.ranks)), cfg) for name, cfg in config.items()}
    # the value kept under a "pgs" key is always such a dict (the one put here or an equal one)
    key = ("pgs", tuple(sorted((n, id(c)) for n, c in kept.items())))
    return cast(dict[str, PgConfig], shared.setdefault(key, kept))


def _defined(column: array[int], calls: dict[int, tuple[Any, ...]], checked: set[int]) -> None:
    """Every call id in ``column`` is one this summary defines (checked once per column object)."""
    if id(column) not in checked:
        if any(f not in calls for f in column):
            raise ValueError("a call id the summary does not define")
        checked.add(id(column))


def _text_once(shared: dict[tuple[Any, ...], Any], text: str) -> str:
    """``text``, one object for all its copies; checked printable the first time it is met."""
    if ("text", text) not in shared and not text.isprintable():
        raise ValueError("a name with control characters")
    return cast(str, shared.setdefault(("text", text), text))  # a "text" key always holds its text


def _shared_text(shared: dict[tuple[Any, ...], Any], value: Any) -> str:
    text = dump_text(value)
    return cast(str, shared.setdefault(("text", text), text))  # a "text" key always holds its text


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _calls(value: Any) -> dict[int, tuple[Any, ...]]:
    """id -> comparable call, each id recomputed from its call (a summary cannot pass one call for another)."""
    out: dict[int, tuple[Any, ...]] = {}
    for item in _list(value):
        if not isinstance(item, list) or len(item) != 6 or not int64(item[0]):
            raise ValueError("a malformed call")
        call = tuple(item[1:])
        if not fingerprint_ok(call) or fingerprint_id(call) != item[0]:
            raise ValueError("a call whose id does not match it")
        out[item[0]] = call
    return out


def _int64s(data: Any, n: int | None = None) -> array[int]:
    if type(data) is not bytes or len(data) % 8:
        raise ValueError("a column is not int64 bytes")
    col = array("q")
    col.frombytes(data)
    if _BIG_ENDIAN:
        col.byteswap()
    if n is not None and len(col) != n:
        raise ValueError("columns of unequal length")
    return col


def _flags_once(shared: dict[tuple[Any, ...], Any], data: Any, n: int) -> bytes:
    """A completion-flag column, one object for all its equal copies; checked the first time it is met."""
    kept = shared.get(("done", data)) if type(data) is bytes else None
    if kept is None and type(data) is bytes and len(data) == n and max(data, default=0) <= 1:
        kept = shared[("done", data)] = data
    if kept is None or len(kept) != n:
        raise ValueError("a flag column is not 0/1 bytes of its length")
    return cast(bytes, kept)


def _steps(value: Any, shared: dict[tuple[Any, ...], Any]) -> StepLog | None:
    if value is None:
        return None
    step, source, steps, starts = value
    step_col, start_col = shared.setdefault(("steps", steps), _int64s(steps)), _int64s(starts)
    if (type(step) is not int or abs(step) >= 1 << 62 or type(source) is not str or len(step_col) != len(start_col)
            or len(start_col) > RING or min(start_col, default=0) < 0 or list(start_col) != sorted(start_col)):
        raise ValueError("a bad step log")
    return StepLog(step, StepStarts(step_col, start_col), printable(source)[:32])


def _history(item: Any, calls: dict[int, tuple[Any, ...]], shared: dict[tuple[Any, ...], Any], checked: set[int],
             ) -> GroupHistory:
    """One group's columns; ``checked``: the shared columns this summary's calls were checked to define."""
    name, desc, local_id, seq, done, created, fp, p2p_count, p2p = item
    if type(name) is not str or type(desc) is not str:
        raise ValueError("a group name is not text")
    name, desc = _text_once(shared, name), _text_once(shared, desc)
    if type(seq) is list:
        if len(seq) != 2 or not (int64(seq[0]) and int64(seq[1])) or not 0 <= seq[0] <= seq[1]:
            raise ValueError("a bad sequence run")
        seq_col: array[int] | range = shared.setdefault(("run", seq[0], seq[1]), range(seq[0], seq[1]))
    else:
        seq_col = _int64s(seq)
    n = len(seq_col)
    created_col = _int64s(created, n)
    fp_col = shared.get(("fp", fp)) if type(fp) is bytes else None
    if fp_col is None:  # every member of a group made the same calls: one column for all of them
        fp_col = shared[("fp", fp)] = _int64s(fp, n)
    elif len(fp_col) != n:
        raise ValueError("columns of unequal length")
    flags = _flags_once(shared, done, n)
    if n and (min(created_col) < 0 or (type(seq_col) is not range and min(seq_col) < 0)):
        raise ValueError("columns out of range")
    _defined(fp_col, calls, checked)
    channels: dict[str, P2PChannel] = shared.setdefault(("no p2p", None), {}) if not p2p else {}  # never written to
    for chan in p2p if type(p2p) is list else ():
        key, ch_done, ch_created, ch_fp = chan
        ch_created_col = _int64s(ch_created)
        m = len(ch_created_col)
        ch_fp_col = shared.get(("fp", ch_fp)) if type(ch_fp) is bytes else None
        if ch_fp_col is None or len(ch_fp_col) != m:
            ch_fp_col = shared[("fp", ch_fp)] = _int64s(ch_fp, m)
        channel = P2PChannel(_flags_once(shared, ch_done, m), ch_created_col, ch_fp_col)
        if type(key) is not str or min(ch_created_col, default=0) < 0:
            raise ValueError("a bad send/recv channel")
        _defined(ch_fp_col, calls, checked)
        channels[printable(key)] = channel
    return GroupHistory(name=name, desc=desc, local_id=counter(local_id), seq=seq_col, completed=flags,
                        created_ns=created_col, fingerprint=fp_col, p2p_count=counter(p2p_count), p2p=channels)


def _rank_dump(record: Any, source: str, calls: dict[int, tuple[Any, ...]], configs: list[dict[str, PgConfig]],
               stacks: dict[tuple[int, ...], tuple[Frame, ...]], shared: dict[tuple[Any, ...], Any],
               checked: set[int], problems: list[str]) -> RankDump:
    if not isinstance(record, dict):
        raise ValueError("not a rank record")  # noqa: TRY004 - the decoder turns ValueError into one problem line
    rank = record["rank"]
    if type(rank) is not int or rank < 0:
        raise ValueError("no rank")
    histories = {}
    for item in _list(record["histories"]):
        h = _history(item, calls, shared, checked)
        histories[h.name] = h
    status = {}
    for slot, enqueued, started, completed in _list(record["status"]):
        progress = Progress(counter(enqueued), counter(started), counter(completed))
        status[counter(slot)] = shared.setdefault(("progress", progress), progress)  # most ranks agree: one object
    backend = dump_text(record.get("backend")) or "unknown"
    raw_tail = _list(record.get("tail"))[:_MAX_TAIL]
    faults = EntryFaults(f"{source} rank {rank}")
    tail = []
    for i, e in enumerate(raw_tail):
        try:
            entry = entry_from_raw(e, i, backend == "gloo", faults, stacks)
        except BadField as exc:
            faults.drop(i, str(exc))
            continue
        tail.append(entry._replace(pg_name=shared.setdefault(("text", entry.pg_name), entry.pg_name),
                                   pg_desc=shared.setdefault(("text", entry.pg_desc), entry.pg_desc),
                                   profiling_name=shared.setdefault(("text", entry.profiling_name), entry.profiling_name),
                                   thread_name=shared.setdefault(("text", entry.thread_name), entry.thread_name),
                                   state=shared.setdefault(("text", entry.state), entry.state)))
    problems.extend(faults.lines())
    pg = record["pg"]
    latest, count = record["latest"], record["entries"]
    if not (int64(latest) and latest >= 0 and int64(count) and count >= 0):
        raise ValueError("bad counts")
    text = partial(_shared_text, shared)
    dump = RankDump(
        rank=rank, path=f"{source} rank {rank}", version=text(record.get("version")), backend=text(backend),
        comm_lib_version=text(record.get("comm")), pg_config=configs[pg] if type(pg) is int and pg >= 0 else {},
        pg_status=status, histories=histories, tail=tail, entry_count=count,
        fingerprints=calls, latest_ns=latest, from_start=record.get("from_start") is True,
        has_frames=record.get("has_frames") is True, process=process_from_raw(record.get("process"), "agent"),
        steps=_steps(record.get("steps"), shared), compact=True,
    )
    for mark in failed_from_raw(record.get("failed")):
        dump.mark_failed(mark)
    dump.exit = exit_from_raw(record.get("exit"))
    return dump
