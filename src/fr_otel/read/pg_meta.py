"""Process-group metadata in a dump: ``pg_config`` (names, descriptions, members) and
``pg_status`` (each group's last enqueued/started/completed sequence numbers).

Both are untrusted: a malformed mapping costs one problem line and is ignored; member lists
are parsed once per distinct text (every rank repeats the world group's 16k members).
"""

from __future__ import annotations

from typing import Any

from ..common.text import printable
from .dump import PgConfig, Progress
from .validate import counter, int64

__all__ = ["dump_text", "member_runs", "parse_ranks", "pg_config", "pg_status"]


def dump_text(value: Any) -> str:
    """A name or version from the dump: strings as they are (escaped), numbers as text, anything else empty."""
    if type(value) is str:
        return printable(value)
    return str(value) if int64(value) else ""


_RANKS_SEEN: dict[str, tuple[int, ...] | None] = {}
_RANKS_SEEN_CHARS = 1 << 24  # a bound on the text kept as keys


def parse_ranks(value: Any) -> tuple[int, ...] | None:
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
        items: list[int] | None = list(map(int, inner.split(",")))
    except ValueError:
        items = _expand_runs(inner)  # fr-otel's own payloads write runs: "[0-16383]"
    if items is None:
        return None
    if min(items) < 0:
        return None
    return tuple(sorted(set(items)))


_MAX_RUN_RANKS = 1 << 24


def member_runs(ranks: tuple[int, ...] | list[int]) -> str:
    """Sorted members as fr-otel writes them in its own payloads: runs, strided where regular
    (``0-16383``, ``5-16381:8``, ``3``): a data-parallel group of 12,500 ranks, every 8th, is a few
    bytes, not 80 KB in every one of its members' payloads. :func:`parse_ranks` reads it back."""
    n = len(ranks)
    if n > 2:  # one regular run (the world, a data-parallel group): said at C speed
        step = ranks[1] - ranks[0]
        if step > 0 and ranks[-1] == ranks[0] + step * (n - 1) and list(ranks) == list(range(ranks[0], ranks[-1] + 1, step)):
            return f"{ranks[0]}-{ranks[-1]}" + (f":{step}" if step != 1 else "")
    parts: list[str] = []
    i = 0
    while i < n:
        j = i + 1
        if j < n:
            step = ranks[j] - ranks[i]
            while j + 1 < n and ranks[j + 1] - ranks[j] == step:
                j += 1
            if step == 1 or j - i >= 2:
                parts.append(f"{ranks[i]}-{ranks[j]}" + (f":{step}" if step != 1 else ""))
                i = j + 1
                continue
        parts.append(str(ranks[i]))
        i += 1
    return ",".join(parts)


def _expand_runs(inner: str) -> list[int] | None:
    """``"0-3, 8, 9-21:4"`` -> [0, 1, 2, 3, 8, 9, 13, 17, 21]; None unless every item is a rank or an
    ascending run, strided or not, that ends on its last member (and the whole stays under 16M
    ranks: a hostile "0-10**12" is refused, not expanded)."""
    items: list[int] = []
    for part in inner.split(","):
        run, colon, stride = part.strip().partition(":")
        first, dash, last = run.partition("-")
        try:
            if not dash and not colon:
                items.append(int(first))
                continue
            a, b, step = int(first), int(last), int(stride) if colon else 1
        except ValueError:
            return None
        if not first or b < a or step < 1 or (b - a) % step or len(items) + (b - a) // step >= _MAX_RUN_RANKS:
            return None
        items.extend(range(a, b + 1, step))
    return items


def pg_config(value: Any, path: str, problems: list[str]) -> dict[str, PgConfig]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{path}: 'pg_config' is a {type(value).__name__}, not a mapping; ignored")
        return {}
    out: dict[str, PgConfig] = {}
    for key, cfg in value.items():
        if not isinstance(cfg, dict):
            continue
        name = dump_text(cfg.get("name", key))
        out[name] = PgConfig(name=name, desc=dump_text(cfg.get("desc", "")), ranks=parse_ranks(cfg.get("ranks")))
    return out


def pg_status(value: Any, path: str, problems: list[str]) -> dict[int, Progress]:
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
