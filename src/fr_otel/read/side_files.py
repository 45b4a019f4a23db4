"""The files beside the dumps (``ranks.json``, ``steps.json``, ``incident.json``): one bounded boundary.

They come from the same shared folder as the dumps, so whoever can write there can put
anything in them: a FIFO, a link to a device or to itself, a 2 KB file of 1000 ``[``, a
rank key ``"²"`` (``"²".isdigit()`` is true, ``int("²")`` raises), a lone surrogate or an
OSC title sequence in a string, three million attributes. Every rule that turns such a file
into plain, trusted values lives here, the way :mod:`fr_otel.read.validate` holds the
dumps' rules: a file that cannot be used is one problem line naming it, never an exception.

- it must be a regular file (opened without blocking, so a FIFO never waits for a writer),
  at most :data:`MAX_BYTES`, JSON nested at most :data:`MAX_DEPTH` deep with at most
  :data:`MAX_CONTAINERS` arrays and objects (counted on the bytes, before parsing);
- every string in it, keys included, is escaped once (:func:`fr_otel.common.text.printable`),
  so the terminal, the report and span attributes all get the same safe text;
- rank keys are ASCII digits (:func:`rank_key`); attribute lists are capped in count and size
  (:func:`bounded_attributes`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, TypeVar

from ..common.files import FileTooLarge, NotRegularFile, read_regular
from ..common.text import MAX_ATTRIBUTE_CHARS, clip, one_line, printable

__all__ = [
    "MAX_ATTRIBUTES", "MAX_ATTRIBUTE_KEY", "MAX_BYTES", "MAX_CONTAINERS", "MAX_DEPTH",
    "MAX_RANK",
    "bounded_attributes", "per_rank", "rank_key", "read_per_rank_file", "read_side_file", "side_file_present",
]

MAX_BYTES = 64 << 20  # a map of 100k ranks is ~20 MB
#: Deepest nesting any side file needs is 8 (incident.json: ranks/rank/now/threads/thread/frames/frame).
MAX_DEPTH = 32
#: Arrays and objects in one file: a 64 MiB steps.json of ~4000 ranks holds ~2 million (each
#: costs ~100 bytes once parsed, so this also bounds the memory a file can take).
MAX_CONTAINERS = 4_000_000
#: Rank keys above this are not ranks (torch's ranks are 32-bit ints).
MAX_RANK = (1 << 31) - 1
#: Root span attributes taken from one file: the agent writes about 8.
MAX_ATTRIBUTES = 64
MAX_ATTRIBUTE_KEY = 128
_ATTRIBUTE_TYPES = (str, int, float, bool)
_INT64 = 1 << 63
T = TypeVar("T")


def side_file_present(path: str) -> bool:
    """Something is at ``path`` (a file, a FIFO, a looping or dangling link...): it is read, so
    that what is wrong with it is said, rather than skipped in silence."""
    return os.path.lexists(path)


def read_side_file(path: str, problems: list[str], consequence: str) -> dict[str, Any] | None:
    """The file's top-level JSON object with every string escaped, or None with one problem
    line ending in ``consequence`` (what is unknown without it)."""
    try:
        data = read_regular(path, MAX_BYTES)
    except NotRegularFile as exc:
        problems.append(f"{path}: not a regular file ({exc.kind}); {consequence}")
        return None
    except FileTooLarge:
        problems.append(f"{path}: larger than {MAX_BYTES >> 20} MiB; {consequence}")
        return None
    except OSError as exc:
        problems.append(f"{path}: cannot read: {exc.strerror or one_line(exc)}; {consequence}")
        return None
    containers = data.count(b"[") + data.count(b"{")  # an upper bound (brackets in strings count too)
    if containers > MAX_CONTAINERS:
        problems.append(f"{path}: JSON with up to {containers} arrays and objects (at most {MAX_CONTAINERS}); "
                        f"{consequence}")
        return None
    too_deep = f"{path}: JSON nested deeper than {MAX_DEPTH} levels; {consequence}"
    try:
        doc = json.loads(data)
    except RecursionError:
        problems.append(too_deep)
        return None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a number of 5000 digits
        why = one_line(exc)
        if "integer string conversion" in why:
            why = "a number with thousands of digits"
        problems.append(f"{path}: invalid JSON ({why}); {consequence}")
        return None
    if not isinstance(doc, dict):
        problems.append(f"{path}: not a JSON object; {consequence}")
        return None
    if not _escape_in_place(doc):
        problems.append(too_deep)
        return None
    return doc


def _escape_in_place(doc: dict[str, Any]) -> bool:
    """Every string of ``doc`` (keys too) through :func:`printable`, in place (only the strings
    that need it are replaced: ``str.isprintable`` is C-speed); False, half done, when ``doc``
    nests deeper than :data:`MAX_DEPTH`. Iterative: depth is counted, never recursed into."""
    todo: list[tuple[Any, int]] = [(doc, 1)]
    while todo:
        node, depth = todo.pop()
        if depth > MAX_DEPTH:
            return False
        if isinstance(node, dict):
            if not all(key.isprintable() for key in node):
                items = list(node.items())
                node.clear()
                node.update((printable(key), value) for key, value in items)
            pairs: Any = node.items()
        else:
            pairs = enumerate(node)
        for key, value in pairs:
            if type(value) is str:
                if not value.isprintable():
                    node[key] = printable(value)
            elif type(value) is dict or type(value) is list:
                todo.append((value, depth + 1))
    return True


def rank_key(key: Any) -> int | None:
    """The rank a JSON key names: ASCII digits only (``"²"`` and ``"٣"`` are not ranks), at most
    :data:`MAX_RANK`; else None."""
    if type(key) is not str or not (0 < len(key) <= 10 and key.isascii() and key.isdigit()):
        return None
    rank = int(key)
    return rank if rank <= MAX_RANK else None


def per_rank(path: str, doc: dict[str, Any] | None, problems: list[str], consequence: str,
             parse: Callable[[Any], T | None]) -> dict[int, T]:
    """``doc["ranks"]`` (``{"<rank>": value}``) as rank -> ``parse(value)``; items with a bad key
    or an unusable value cost one line in all."""
    ranks = doc.get("ranks") if doc is not None else None
    if doc is not None and not isinstance(ranks, dict):
        problems.append(f"{path}: no 'ranks' mapping; {consequence}")
    if not isinstance(ranks, dict):
        return {}
    out: dict[int, T] = {}
    bad = 0
    for key, value in ranks.items():
        rank = rank_key(key)
        item = parse(value) if rank is not None else None
        if rank is None or item is None:
            bad += 1
        else:
            out[rank] = item
    if bad:
        problems.append(f"{path}: {bad} malformed rank entr{'y' if bad == 1 else 'ies'} ignored")
    return out


def read_per_rank_file(path: str, problems: list[str], consequence: str,
                       parse: Callable[[Any], T | None]) -> dict[int, T]:
    """``{"ranks": {"<rank>": value}}`` from ``path``: rank -> ``parse(value)`` (see :func:`per_rank`)."""
    return per_rank(path, read_side_file(path, problems, consequence), problems, consequence, parse)


def bounded_attributes(path: str, raw: Any, problems: list[str], prefix: str = "") -> tuple[tuple[str, Any], ...]:
    """``[[key, value], ...]`` as span attributes: the first :data:`MAX_ATTRIBUTES`, keys starting
    with ``prefix`` of at most :data:`MAX_ATTRIBUTE_KEY` characters, values a string (clipped to
    :data:`MAX_ATTRIBUTE_CHARS`), an int64, a float or a bool; the first key wins. What is
    dropped or clipped costs one line."""
    if not isinstance(raw, list):
        return ()
    out: dict[str, Any] = {}
    dropped = clipped = 0
    for i, item in enumerate(raw):
        if i >= MAX_ATTRIBUTES:
            dropped += len(raw) - i
            break
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and len(prefix) < len(item[0]) <= MAX_ATTRIBUTE_KEY and item[0].startswith(prefix)
                and type(item[1]) in _ATTRIBUTE_TYPES):
            dropped += 1
            continue
        key, value = item
        if type(value) is int and not -_INT64 <= value < _INT64:
            dropped += 1
            continue
        if isinstance(value, str) and len(value) > MAX_ATTRIBUTE_CHARS:
            value, clipped = clip(value, MAX_ATTRIBUTE_CHARS), clipped + 1
        out.setdefault(key, value)
    if dropped or clipped:
        what = [f"{dropped} ignored" if dropped else "", f"{clipped} clipped to {MAX_ATTRIBUTE_CHARS} characters"
                if clipped else ""]
        keys = f"{prefix}* keys" if prefix else "keys"
        problems.append(f"{path}: root attributes: {', '.join(w for w in what if w)} (at most {MAX_ATTRIBUTES} "
                        f"attributes, {keys} of at most {MAX_ATTRIBUTE_KEY} characters, values str/int64/float/bool)")
    return tuple(out.items())
