"""Every field of an untrusted dump typed and range-checked once, at the reader boundary.

A dump is data from a shared disk, a crashed process or an attacker. Whatever it
holds, what leaves the reader is a model the rest of fr-otel can trust without
checking again: integers fit int64 (protobuf, ``array('q')``), times are >= 0,
booleans are real booleans (``True`` is not sequence number 1), strings are
printable UTF-8 (control characters and lone surrogates escaped), lists have the
expected shape. A bad *entry* is repaired (an optional field reset to "unknown") or
dropped (a field the analysis needs); the rest of the rank is still read, and each
kind of fault costs one problem line naming the file, the entry and the field.

Two speeds, so validation costs almost nothing on good dumps:

- :func:`columns_ok` and :func:`fingerprint_ok` check the columns the reader's summary
  extracts anyway, across all entries at once with C-level builtins (``set``, ``min``)
  and over the few distinct values in Python; they only say yes or no;
- :func:`entry_from_raw` checks every field of one entry as it becomes an
  :class:`~fr_otel.read.dump.Entry` (the tail always; every entry when a column failed).
"""

from __future__ import annotations

import math
import reprlib
import sys
from array import array
from typing import Any, Sequence, TypeGuard, TypeVar

from ..common.text import one_line, printable
from .dump import Entry
from .entry_rules import completed
from .frame import Frame

__all__ = [
    "INT64_MAX",
    "BadField",
    "EntryFaults",
    "columns_ok",
    "counter",
    "entry_from_raw",
    "fingerprint_ok",
    "int64",
    "UNKNOWN_CALL",
    "is_unknown_call",
]

_T = TypeVar("_T")

INT64_MAX = 2**63 - 1
# The dtypes a repaired sizes/dtypes field reads as: no c10 dtype name has angle brackets, so the
# call is never equal to a real one, and the mismatch rule leaves it out instead of blaming it.
UNKNOWN_CALL: tuple[str, ...] = ("<unknown>",)
INT64_MIN = -(2**63)
_SEQ = (list, tuple)
# Far above any real call or stack, low enough that a pickle which repeats one shared list
# (a few bytes each, by memo reference) cannot make a pass over the entries take minutes.
MAX_TENSORS_PER_CALL = 4096
MAX_DIMS = 64
MAX_FRAMES = 1024
_MISSING = object()


class BadField(ValueError):
    """A field the analysis needs is missing or wrong: the entry is dropped."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"'{field}' {why}")
        self.field = field


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 30
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = 3
_SHORT.maxlevel = 2


def _short(value: Any) -> str:
    """A bounded, printable repr: a 1 MB string or a 100 000-deep list costs nothing here."""
    try:
        return one_line(_SHORT.repr(value), 60)
    except (ValueError, RecursionError):  # e.g. an int over Python's 4300-digit str() limit
        return f"<{type(value).__name__} too large to show>"


def _what(value: Any) -> str:
    """A short, safe description of a bad value for a problem line."""
    if value is _MISSING:
        return "is missing"
    return f"is {type(value).__name__} {_short(value)}"


def int64(value: Any) -> TypeGuard[int]:
    """True for a real int (not a bool) that fits a signed 64-bit field."""
    return type(value) is int and INT64_MIN <= value <= INT64_MAX


def counter(value: Any) -> int:
    """A pg_status counter: an int64, or the decimal string JSON dumps write; ValueError otherwise."""
    if type(value) is str and 0 < len(value) <= 20:
        try:
            value = int(value)
        except ValueError:
            pass
    if not int64(value):
        raise ValueError(f"not a 64-bit counter: {_short(value)}")
    return value


# --------------------------------------------------------------------------- hooks for the column builder
# ``fr_otel.read.columns.summarise`` extracts the columns anyway; these check what it extracted
# (C-speed set/min/max over whole columns, Python only over the few distinct values: each
# distinct fingerprint once per process) and send any dump they reject down the validating
# slow path (:func:`entry_from_raw`). The int64 bound is ``array('q')``'s own OverflowError.


def columns_ok(groups: Sequence[Any], seq: Sequence[int], seq_col: array[int], created_col: array[int], is_p2p: bytes,
               done: bytes) -> bool:
    """Every group a (name, desc) pair of printable strings; sequence numbers (not bools: ``True``
    is no sequence number) and times >= 0; flags 0 or 1. ``*_col`` are the columns as ``array('q')``."""
    if max(is_p2p, default=0) > 1 or max(done, default=0) > 1 or bool in set(map(type, seq)):
        return False
    if _any_negative(seq_col) or _any_negative(created_col):
        return False
    try:
        distinct = set(groups)
    except TypeError:  # JSON writes lists; anything else unhashable is junk
        if not set(map(type, groups)) <= {list, tuple}:
            return False
        try:
            distinct = set(map(tuple, groups))
        except TypeError:
            return False
    for group in distinct:
        if type(group) is not tuple or len(group) != 2 or type(group[0]) is not str or type(group[1]) is not str:
            return False
        if not (group[0].isprintable() and group[1].isprintable()):
            return False
    return True


def _any_negative(col: array[int]) -> bool:
    """Any value < 0 in an ``array('q')``: the sign bit of each value's top byte, at memcpy speed."""
    if not col:
        return False
    top = 7 if sys.byteorder == "little" else 0
    return max(col.tobytes()[top::8]) >= 0x80


def _shapes_ok(sizes: Any) -> bool:
    """None, or at most MAX_TENSORS_PER_CALL shapes of at most MAX_DIMS int64 dims >= 0 (not bools).
    Plain loops: this runs for every entry of every tail, and generators cost twice as much."""
    if sizes is None:
        return True
    if type(sizes) not in _SEQ or len(sizes) > MAX_TENSORS_PER_CALL:
        return False
    for shape in sizes:
        if type(shape) not in _SEQ or len(shape) > MAX_DIMS:
            return False
        for n in shape:
            if type(n) is not int or not 0 <= n <= INT64_MAX:
                return False
    return True


def _names_ok(dtypes: Any) -> bool:
    return dtypes is None or type(dtypes) in _SEQ and len(dtypes) <= MAX_TENSORS_PER_CALL and all(
        type(d) is str and d.isprintable() for d in dtypes)


def fingerprint_ok(fp: tuple[Any, ...]) -> bool:
    """One distinct (profiling_name, input_sizes, input_dtypes, output_sizes, output_dtypes) is well formed."""
    name, in_sizes, in_dtypes, out_sizes, out_dtypes = fp
    return (type(name) is str and name.isprintable() and _shapes_ok(in_sizes) and _shapes_ok(out_sizes)
            and _names_ok(in_dtypes) and _names_ok(out_dtypes))


# --------------------------------------------------------------------------- one entry, every field


class EntryFaults:
    """What was wrong with one file's entries: one problem line per kind of fault."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.dropped = 0
        self._first_drop = ""
        self._repairs: dict[str, tuple[int, str, int]] = {}  # field -> (first entry, why, count)

    def drop(self, index: int, why: str) -> None:
        self.dropped += 1
        if not self._first_drop:
            self._first_drop = f"entry {index}: {why}"

    def repair(self, index: int, field: str, why: str) -> None:
        first = self._repairs.get(field)
        self._repairs[field] = (index, why, 1) if first is None else (first[0], first[1], first[2] + 1)

    def lines(self) -> list[str]:
        """The problem lines, each naming the file, the (first) entry and the field."""
        out: list[str] = []
        if self.dropped:
            plural = "y" if self.dropped == 1 else "ies"
            out.append(f"{self.path}: {self.dropped} malformed entr{plural} skipped (first: {self._first_drop})")
        for field, (index, why, count) in self._repairs.items():
            more = f" (and {count - 1} more entr{'y' if count == 2 else 'ies'})" if count > 1 else ""
            out.append(f"{self.path}: entry {index}: '{field}' {why}; read as unknown{more}")
        return out


def _required_int(e: dict[str, Any], key: str, low: int = INT64_MIN) -> int:
    value = e.get(key, _MISSING)
    if not int64(value) or value < low:
        raise BadField(key, _what(value) + ("" if low == INT64_MIN else f", not an integer >= {low}"))
    return value


def _required_text(e: dict[str, Any], key: str) -> str:
    value = e.get(key, _MISSING)
    if type(value) is not str:
        raise BadField(key, _what(value) + ", not a string")
    return printable(value)


class _Reader:
    """Reads one entry's optional fields, noting each repair."""

    __slots__ = ("e", "index", "faults")

    def __init__(self, e: dict[str, Any], index: int, faults: EntryFaults) -> None:
        self.e, self.index, self.faults = e, index, faults

    def bad(self, key: str, value: Any, want: str, default: _T) -> _T:
        self.faults.repair(self.index, key, f"{_what(value)}, not {want}")
        return default

    def integer(self, key: str, default: int, low: int = INT64_MIN) -> int:
        value = self.e.get(key, default)
        if int64(value) and value >= low:
            return value
        return self.bad(key, value, "a 64-bit integer" if low == INT64_MIN else f"an integer >= {low}", default)

    def time(self, key: str) -> int | None:
        value = self.e.get(key)
        if value is None or value == 0 and type(value) is int:
            return None  # JSON writes 0 where pickle writes None
        if int64(value) and value > 0:
            return value
        return self.bad(key, value, "a time in ns >= 0", None)

    def flag(self, key: str) -> bool:
        value = self.e.get(key, False)
        if type(value) is bool:
            return value
        if type(value) is int and value in (0, 1):  # an older writer's 0/1
            return bool(value)
        return self.bad(key, value, "a boolean", False)

    def text(self, key: str, default: str) -> str:
        value = self.e.get(key, default)
        if type(value) is str:
            return printable(value)
        if key == "thread_id" and int64(value):
            return str(value)
        return self.bad(key, value, "a string", default)

    def duration(self) -> float | None:
        value = self.e.get("duration_ms")
        if value is None:
            return None
        if type(value) in (int, float) and math.isfinite(value) and 0 <= value <= INT64_MAX / 1e6:
            return float(value)
        return self.bad("duration_ms", value, "a number of ms >= 0", None)

    def timeout(self) -> int | None:
        value = self.e.get("timeout_ms")
        if value is None:
            return None
        if int64(value) and value >= 0:
            return value
        return self.bad("timeout_ms", value, "an integer of ms >= 0", None)

    def sizes(self, key: str) -> tuple[tuple[int, ...], ...] | None:
        """The shapes, or None when they were unreadable (the caller marks the call unknown)."""
        value = self.e.get(key) or ()
        if _shapes_ok(value):
            return _shared(tuple(map(tuple, value)))
        return self.bad(key, value, f"a list of at most {MAX_TENSORS_PER_CALL} shapes (lists of at most {MAX_DIMS} integers >= 0)", None)

    def dtypes(self, key: str) -> tuple[str, ...]:
        value = self.e.get(key) or ()
        if type(value) in _SEQ and len(value) <= MAX_TENSORS_PER_CALL and all(type(d) is str for d in value):
            return _shared(tuple(map(printable, value)))
        return self.bad(key, value, f"a list of at most {MAX_TENSORS_PER_CALL} strings", UNKNOWN_CALL)

    def frames(self, stacks: dict[tuple[int, ...], tuple[Frame, ...]]) -> tuple[Frame, ...]:
        frames = self.e.get("frames")
        if not frames:
            return ()
        if type(frames) not in _SEQ or len(frames) > MAX_FRAMES:
            return self.bad("frames", frames, f"a list of at most {MAX_FRAMES} frames", ())
        # Frame dicts are shared objects inside one pickle: key stacks by identity while
        # the raw dump keeps them alive, and build each distinct stack once.
        key = tuple(map(id, frames))
        stack = stacks.get(key)
        if stack is None:
            try:
                stack = tuple(_frame(f) for f in frames)
            except ValueError as exc:
                return self.bad("frames", frames, f"a list of frames ({exc})", ())
            stacks[key] = stack
        return stack


_SHAPES: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # one tuple object per distinct sizes/dtypes value in the process


def _shared(value: tuple[Any, ...]) -> tuple[Any, ...]:
    if len(_SHAPES) > 65536:
        _SHAPES.clear()
    return _SHAPES.setdefault(value, value)


def _frame(f: Any) -> Frame:
    if type(f) is not dict:
        raise ValueError(f"a frame is a {type(f).__name__}")
    name, filename, line = f.get("name"), f.get("filename"), f.get("line")
    if type(name) is not str or type(filename) is not str or not int64(line):
        raise ValueError("a frame needs name, filename (strings) and line (integer)")
    return Frame(printable(name), printable(filename), line)


def _call_side(
    sizes: tuple[tuple[int, ...], ...] | None, dtypes: tuple[str, ...]
) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    """Unreadable shapes make that side's call unknown (no shapes, :data:`UNKNOWN_CALL` dtypes)."""
    return ((), UNKNOWN_CALL) if sizes is None else (sizes, dtypes)


def is_unknown_call(fp: Any) -> bool:
    """A comparable fingerprint (or a coalesced tuple of them) holding a repaired, unknown call."""
    if fp is None:
        return False
    if fp and type(fp[0]) is tuple:  # coalesced: a tuple of calls
        return any(is_unknown_call(f) for f in fp)
    return UNKNOWN_CALL[0] in fp[2] or UNKNOWN_CALL[0] in fp[4]


def entry_from_raw(
    e: Any, index: int, gloo: bool, faults: EntryFaults, stacks: dict[tuple[int, ...], tuple[Frame, ...]]
) -> Entry:
    """One raw entry as a trusted :class:`Entry`; raises :class:`BadField` to drop it.

    Optional fields with a bad value are read as unknown (None, 0, empty) and noted
    in ``faults``; required ones (group, sequence number, op, enqueue time) drop it.
    """
    if type(e) is not dict:
        raise BadField("entry", f"is a {type(e).__name__}, not a mapping")
    group = e.get("process_group", _MISSING)
    if type(group) not in _SEQ or len(group) != 2 or not all(type(x) is str for x in group):
        raise BadField("process_group", _what(group) + ", not a (name, desc) pair of strings")
    seq = _required_int(e, "collective_seq_id", 0)
    name = _required_text(e, "profiling_name")
    created = _required_int(e, "time_created_ns", 0)
    r = _Reader(e, index, faults)
    pg_id = r.integer("pg_id", -1)
    in_sizes, in_dtypes = _call_side(r.sizes("input_sizes"), r.dtypes("input_dtypes"))
    out_sizes, out_dtypes = _call_side(r.sizes("output_sizes"), r.dtypes("output_dtypes"))
    state = r.text("state", "scheduled")
    retired = r.flag("retired")
    return Entry(
        r.integer("record_id", -1),
        pg_id,
        printable(group[0]),
        printable(group[1]),
        seq,
        r.integer("p2p_seq_id", 0),
        r.integer("op_id", 0),
        name,
        r.flag("is_p2p"),
        state,
        retired,
        completed(state, retired, gloo),
        created,
        r.time("time_discovered_started_ns"),
        r.time("time_discovered_completed_ns"),
        r.duration(),
        r.timeout(),
        in_sizes,
        in_dtypes,
        out_sizes,
        out_dtypes,
        r.text("thread_name", ""),
        r.text("thread_id", ""),
        r.frames(stacks),
    )
