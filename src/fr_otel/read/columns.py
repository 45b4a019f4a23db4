"""Turn a dump's raw entry dicts into per-group columns, at C speed.

Building a Python object per entry costs more than unpickling it. The analysis needs
only a few numbers per entry (group, seq, completed, enqueue time, a fingerprint of
op/sizes/dtypes), so those are pulled out in one ``operator.itemgetter`` pass over the
entry dicts, transposed into columns by one ``zip``, and split by group with one sort and
``itemgetter`` gathers: all loops in C. A contiguous seq run is kept as a ``range``.
Each distinct call is validated and hashed once per process (from a version-2 ``marshal``
encoding: no back-references, so equal values give equal bytes whatever their object
identity, pickle or JSON) into ids every process computes alike. Only the newest and the
in-flight entries become :class:`Entry` objects (the ``tail``).

Where the optional extension ``_column_scan`` (C) was built, that one pass runs there instead
(~7x faster): it takes only canonical entries and answers None for anything else, so
:func:`summarise_in_python` stays the reference and decides every odd case.
"""

from __future__ import annotations

import hashlib
import marshal
import os
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import itemgetter, methodcaller, not_
from typing import Any, Callable, Iterable, Sequence

from .dump import GroupHistory, P2PChannel, op_name
from .entry_rules import done_flags
from .validate import INT64_MAX, columns_ok, fingerprint_ok

try:  # the optional compiled scan (setuptools builds it where a C compiler is found)
    from ._column_scan import scan as _compiled_scan
except ImportError:  # pragma: no cover - exercised where the extension was not built
    _compiled_scan = None
if os.environ.get("FR_OTEL_PURE_PYTHON", "").strip().lower() in ("1", "true", "yes", "on"):
    _compiled_scan = None
#: The compiled scan is in use: built, and not turned off with ``FR_OTEL_PURE_PYTHON=1``.
COMPILED = _compiled_scan is not None

__all__ = ["COMPILED", "Summary", "summarise", "summarise_in_python", "comparable_fingerprint", "fingerprint_id",
           "TAIL_PER_GROUP"]

TAIL_PER_GROUP = 16  # newest entries per group kept whole (focus, evidence, stacks)
_MAX_TAIL_IN_FLIGHT = 512

_GROUP = itemgetter("process_group")
_NAME = itemgetter(0)
_DESC = itemgetter(1)
_SEQ = itemgetter("collective_seq_id")
_CREATED = itemgetter("time_created_ns")
_PG_ID = itemgetter("pg_id")
_IS_P2P = methodcaller("get", "is_p2p", False)
_RETIRED = methodcaller("get", "retired", False)
_STATE = methodcaller("get", "state", "scheduled")
_DONE_AT = methodcaller("get", "time_discovered_completed_ns")
_FP = itemgetter("profiling_name", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes")


@dataclass(slots=True)
class Summary:
    histories: dict[str, GroupHistory]
    tail_index: list[int]  # positions (record order) of entries to keep whole
    fingerprints: dict[int, tuple[Any, ...]]
    latest_ns: int
    from_start: bool = False


def comparable_fingerprint(raw: tuple[Any, ...]) -> tuple[Any, ...]:
    """What must agree across ranks for one collective (per-op exceptions for uneven ones)."""
    name, in_sizes, in_dtypes, out_sizes, out_dtypes = raw
    op = op_name(name)
    def as_t(sizes: Iterable[Iterable[int]] | None) -> tuple[tuple[int, ...], ...]:
        return tuple(map(tuple, sizes or ()))

    if "all_to_all" in op or "alltoall" in op:
        return (op, (), tuple(in_dtypes or ()), (), tuple(out_dtypes or ()))  # split sizes may differ
    if op == "gather":
        return (op, as_t(in_sizes), tuple(in_dtypes or ()), (), ())  # only the root has outputs
    if op == "scatter":
        return (op, (), (), as_t(out_sizes), tuple(out_dtypes or ()))  # only the root has inputs
    return (op, as_t(in_sizes), tuple(in_dtypes or ()), as_t(out_sizes), tuple(out_dtypes or ()))


def fingerprint_id(comparable: tuple[Any, ...]) -> int:
    """The id of one comparable call (:func:`comparable_fingerprint`): every process computes the same."""
    digest = hashlib.blake2b(marshal.dumps(comparable, 2), digest_size=7).digest()
    return int.from_bytes(digest, "big")


class _FingerprintIds(dict[bytes, int]):
    """marshal bytes -> fingerprint id, remembered for the life of the process (every rank of a
    job repeats the same few calls): the Python work runs once per distinct call, not per entry.
    ``canonical`` is the compiled scan's own cache (its encoding of a call -> the same ids)."""

    def __init__(self) -> None:
        super().__init__()
        self.meaning: dict[int, tuple[Any, ...]] = {}
        self.canonical: dict[bytes, int] = {}

    def forget_if_full(self) -> None:
        """Bound the memory (called between dumps, never while one is being indexed)."""
        if len(self) + len(self.canonical) >= _MAX_REMEMBERED:
            self.clear()
            self.canonical.clear()
            self.meaning.clear()

    def __missing__(self, encoded: bytes) -> int:
        if len(encoded) > _MAX_CALL_BYTES:  # validation hook: no real call is this big
            raise ValueError("op, sizes or dtypes too large")
        raw = marshal.loads(encoded)
        if not fingerprint_ok(raw):  # validation hook: once per distinct call, never cached when bad
            raise ValueError("malformed op, sizes or dtypes")
        comparable = comparable_fingerprint(raw)
        gid = fingerprint_id(comparable)
        self.meaning[gid] = comparable
        self[encoded] = gid
        return gid

    def id_of_call(self, call: tuple[Any, ...]) -> int:
        """The compiled scan's way in, for a call its own cache has not met: the very checks
        (size as marshalled, shape) and id of the Python path; ValueError if malformed."""
        return self[marshal.dumps(call, 4)]

    def meanings(self, ids: Iterable[int]) -> dict[int, tuple[Any, ...]]:
        return {gid: self.meaning[gid] for gid in set(ids)}


_MAX_REMEMBERED = 1 << 16
_MAX_CALL_BYTES = 1 << 20  # one call's marshalled (op, sizes, dtypes): 4096 tensors fit many times over
_FINGERPRINTS = _FingerprintIds()


# The fast path reads every key the columns need in one C call per entry: the entry dicts are
# megabytes, and each pass over them costs a cache miss per entry (one pass ~0.25 ms per 2000
# entries), so one pass with ten keys beats six passes with two. The compact rows are then
# transposed into columns by one ``zip`` (C), and each row's first five values are its call.
_CALL_KEYS = ("profiling_name", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes")
_ROW = {
    True: itemgetter(*_CALL_KEYS, "process_group", "collective_seq_id", "time_created_ns", "is_p2p", "retired"),
    False: itemgetter(*_CALL_KEYS, "process_group", "collective_seq_id", "time_created_ns", "is_p2p", "state"),
}
_CALL = itemgetter(slice(0, 5))


def summarise(raw: list[dict[str, Any]], gloo: bool) -> Summary | None:
    """Columns per group from well-formed raw entries; None if any is malformed (use the slow path)."""
    _FINGERPRINTS.forget_if_full()
    if _compiled_scan is not None and type(raw) is list:
        scanned = _compiled_scan(raw, gloo, _FINGERPRINTS.canonical, _FINGERPRINTS.id_of_call)
        if scanned is not None:  # None: some value is not in the canonical shape; Python decides below
            try:
                return _from_scan(raw, *scanned)
            except (KeyError, TypeError, IndexError, ValueError, OverflowError):
                return None
    return summarise_in_python(raw, gloo)


def summarise_in_python(raw: list[dict[str, Any]], gloo: bool) -> Summary | None:
    """:func:`summarise` without the compiled scan: the reference for every input."""
    try:
        try:
            rows = list(map(_ROW[gloo], raw))
        except KeyError:  # an older writer left out an optional key: one pass per column, with defaults
            columns = _columns_by_key(raw, gloo)
        else:
            columns = _columns_from_rows(rows, gloo)
            del rows
        groups, seq, created, is_p2p, done, global_ids = columns
        names = list(map(_NAME, groups))
        "".join(names)  # TypeError unless every group name is a str
        seq_col = array("q", seq)  # TypeError or OverflowError unless every value is an int that fits
        created_col = array("q", created)
    except (KeyError, TypeError, IndexError, ValueError, OverflowError):
        return None
    if not columns_ok(groups, seq, seq_col, created_col, is_p2p, done):  # validation hook: shapes, signs, flags
        return None
    fingerprints = _FINGERPRINTS.meanings(global_ids)

    try:
        return _split(raw, groups, names, seq_col, created_col, is_p2p, done, global_ids, fingerprints)
    except (KeyError, TypeError, IndexError, ValueError, OverflowError):
        return None


_Columns = tuple[Sequence[Any], Sequence[Any], Sequence[Any], bytes, bytes, list[int]]


def _call_ids(calls: Iterable[tuple[Any, ...]]) -> list[int]:
    """Each entry's fingerprint id, from one marshal pass; the id of each distinct call is computed
    once per process. marshal 4 writes a list shared by memo reference once, so a pickle that nests
    one list in itself (a few bytes, 2**60 elements unrolled) costs its size here, not its expansion."""
    return list(map(_FINGERPRINTS.__getitem__, map(marshal.dumps, calls, repeat(4))))


def _columns_from_rows(rows: list[tuple[Any, ...]], gloo: bool) -> _Columns:
    if not rows:
        return (), (), (), b"", b"", []
    ids = _call_ids(map(_CALL, rows))
    *_, groups, seq, created, is_p2p, done = zip(*rows)
    return groups, seq, created, bytes(is_p2p), done_flags(done, gloo), ids


def _columns_by_key(raw: list[dict[str, Any]], gloo: bool) -> _Columns:
    return (
        list(map(_GROUP, raw)), list(map(_SEQ, raw)), list(map(_CREATED, raw)), bytes(map(_IS_P2P, raw)),
        done_flags(map(_RETIRED if gloo else _STATE, raw), gloo), _call_ids(map(_FP, raw)),
    )


def _split(
    raw: list[dict[str, Any]], groups: Sequence[Any], names: list[str], seq: array[int], created: array[int],
    is_p2p: bytes, done: bytes, global_ids: list[int], fingerprints: dict[int, tuple[Any, ...]],
) -> Summary:
    histories: dict[str, GroupHistory] = {}
    tail: set[int] = set()
    n = len(raw)
    distinct = dict.fromkeys(names)
    if len(distinct) > 1:
        # One stable sort by group puts each group's entries in a contiguous run (record
        # order kept within it); every column is then gathered once (one C call each).
        order: Sequence[int] = sorted(range(n), key=names.__getitem__)
        gather = itemgetter(*order)
        by_group: Sequence[str] = gather(names)
        g_seq, g_done, g_created, g_fp, g_p2p = map(gather, (seq, done, created, global_ids, is_p2p))
    else:  # one group: record order is group order
        order, by_group = range(n), names
        g_seq, g_done, g_created, g_fp, g_p2p = seq, done, created, global_ids, is_p2p
    for name in distinct:
        lo, hi = bisect_left(by_group, name), bisect_right(by_group, name)
        tail.update(order[max(lo, hi - TAIL_PER_GROUP):hi])
        first = order[lo]
        histories[name] = _history(raw, groups[first], first, g_seq[lo:hi], g_done[lo:hi], g_created[lo:hi],
                                   g_fp[lo:hi], g_p2p[lo:hi], fingerprints)
    return _summary(raw, histories, tail, done, max(created, default=0), fingerprints)


def _from_scan(
    raw: list[dict[str, Any]], groups: list[tuple[Any, ...]], done: bytes, latest_created: int,
    group_tuples: list[tuple[Any, ...]],
    ids: tuple[int, ...] | None,
) -> Summary | None:
    """The Summary from the compiled scan's per-group columns (see ``_column_scan.c``)."""
    if not all(name.isprintable() and desc.isprintable() for name, desc in group_tuples):
        return None  # as columns_ok
    histories: dict[str, GroupHistory] = {}
    tail: set[int] = set()
    columns = [(group, *map(_int64s, (positions, seq, created, fp)), g_done, g_p2p, run)
               for group, positions, seq, created, fp, g_done, g_p2p, run in groups]
    fingerprints = _FINGERPRINTS.meanings(ids if ids is not None else chain.from_iterable(c[4] for c in columns))
    for group, positions, seq, created, fp, g_done, g_p2p, run in columns:
        tail.update(positions[-TAIL_PER_GROUP:])
        histories[group[0]] = _history(raw, group, positions[0], seq, g_done, created, fp, g_p2p, fingerprints,
                                       seq_is_run=run)
    return _summary(raw, histories, tail, done, latest_created, fingerprints)


def _int64s(native: bytes) -> array[int]:
    col = array("q")
    col.frombytes(native)
    return col


def _history(
    raw: list[dict[str, Any]], group: Sequence[str], first: int, seq: Sequence[int], done: Sequence[int],
    created: Sequence[int], fp: Sequence[int], is_p2p: Sequence[int], fingerprints: dict[int, tuple[Any, ...]],
    seq_is_run: bool = False,
) -> GroupHistory:
    """One group's history from its columns (record order); its send/recv split off by channel.
    ``seq_is_run``: the caller already knows ``seq`` is first, first+1, ... (the compiled scan
    checks it for free); it still holds only while no send/recv is split off."""
    n_p2p = is_p2p.count(1)  # 0/1 values: a C count
    channels: dict[str, P2PChannel] = {}
    if n_p2p:
        channels = _p2p_channels(done, created, fp, list(compress(range(len(is_p2p)), is_p2p)), fingerprints)
        keep = list(map(not_, is_p2p))
        pick: Callable[[Sequence[Any]], Iterable[Any]] = lambda col: compress(col, keep)  # noqa: E731
    else:
        pick = lambda col: col  # noqa: E731
    return GroupHistory(
        name=group[0],
        desc=str(_DESC(group)),
        local_id=int(_PG_ID(raw[first])),
        seq=range(seq[0], seq[0] + len(seq)) if seq_is_run and seq and not n_p2p
        else _as_range_if_contiguous(_as_int64s(pick(seq))),
        completed=bytes(pick(done)),
        created_ns=_as_int64s(pick(created)),
        fingerprint=_as_int64s(pick(fp)),
        p2p_count=n_p2p,
        p2p=channels,
    )


def _as_int64s(col: Iterable[int]) -> array[int]:
    return col if type(col) is array else array("q", col)


def _summary(
    raw: list[dict[str, Any]], histories: dict[str, GroupHistory], tail: set[int], done: bytes,
    latest_created: int, fingerprints: dict[int, tuple[Any, ...]],
) -> Summary:
    n = len(raw)
    # The newest in-flight entries, found from the end (a C scan, a Python step per one kept).
    at = n
    for _ in range(_MAX_TAIL_IN_FLIGHT):
        at = done.rfind(0, 0, at)
        if at < 0:
            break
        tail.add(at)
    tail_index = sorted(tail)
    # Completion times only matter near the end: the newest ones are in the tail.
    done_at = [t for t in map(_DONE_AT, map(raw.__getitem__, tail_index)) if type(t) is int and 0 <= t <= INT64_MAX]
    latest = max(latest_created, max(done_at, default=0))
    # The whole history: record ids 0..n-1 with none left out (not wrapped, not only-active).
    ids = (raw[0].get("record_id"), raw[-1].get("record_id")) if raw else (None, None)
    return Summary(histories=histories, tail_index=tail_index, fingerprints=fingerprints, latest_ns=latest,
                   from_start=ids == (0, n - 1))


def _as_range_if_contiguous(seq: array[int]) -> array[int] | range:
    """first, first+1, ..., last as a ``range`` (see ``GroupHistory.contiguous``); compared in one C pass."""
    if not seq or seq[-1] - seq[0] + 1 != len(seq):
        return seq
    run = range(seq[0], seq[-1] + 1)
    return run if seq == array("q", run) else seq


def _p2p_channels(
    g_done: Sequence[int], g_created: Sequence[int], g_fp: Sequence[int], at: list[int],
    fingerprints: dict[int, tuple[Any, ...]],
) -> dict[str, P2PChannel]:
    """A group's send/recv split by channel (``send 1->2``); only groups that carry p2p pay for it.

    The channel is the op of the entry's fingerprint: no per-entry Python work, C-level passes only.
    """
    ids = list(map(g_fp.__getitem__, at))
    by_channel: dict[str, set[int]] = {}
    for fid in set(ids):
        by_channel.setdefault(fingerprints[fid][0], set()).add(fid)
    out: dict[str, P2PChannel] = {}
    for name, fids in by_channel.items():
        mine = list(compress(at, map(fids.__contains__, ids))) if len(by_channel) > 1 else at
        out[name] = P2PChannel(
            done=bytes(map(g_done.__getitem__, mine)),
            created_ns=array("q", map(g_created.__getitem__, mine)),
            fingerprint=array("q", map(g_fp.__getitem__, mine)),
        )
    return out
