"""Small JSON files beside the dumps (``ranks.json``, ``steps.json``): read bounded, fail in one line."""

from __future__ import annotations

import json
from typing import Any, Callable, TypeVar

from ..common.text import one_line

__all__ = ["per_rank", "read_json_file", "read_per_rank_file"]

_MAX_FILE_BYTES = 64 << 20  # a map of 100k ranks is ~20 MB
T = TypeVar("T")


def read_json_file(path: str, problems: list[str], consequence: str) -> dict[str, Any] | None:
    """The file's top-level object, or None with one problem line ending in ``consequence``."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_FILE_BYTES + 1)
        if len(data) > _MAX_FILE_BYTES:
            problems.append(f"{path}: larger than {_MAX_FILE_BYTES >> 20} MB; {consequence}")
            return None
        doc = json.loads(data)
    except OSError as exc:
        problems.append(f"{path}: cannot read: {exc.strerror or exc}; {consequence}")
        return None
    except ValueError as exc:
        problems.append(f"{path}: invalid JSON ({one_line(exc)}); {consequence}")
        return None
    if not isinstance(doc, dict):
        problems.append(f"{path}: not a JSON object; {consequence}")
        return None
    return doc


def read_per_rank_file(path: str, problems: list[str], consequence: str,
                       parse: Callable[[Any], T | None]) -> dict[int, T]:
    """``{"ranks": {"<rank>": value}}``: rank -> ``parse(value)``; bad items cost one line in all."""
    return per_rank(read_json_file(path, problems, consequence), path, problems, consequence, parse)


def per_rank(doc: dict[str, Any] | None, path: str, problems: list[str], consequence: str,
             parse: Callable[[Any], T | None]) -> dict[int, T]:
    """The ``ranks`` mapping of an already-read side file, parsed (see :func:`read_per_rank_file`)."""
    ranks = doc.get("ranks") if doc is not None else None
    if doc is not None and not isinstance(ranks, dict):
        problems.append(f"{path}: no 'ranks' mapping; {consequence}")
    if not isinstance(ranks, dict):
        return {}
    out: dict[int, T] = {}
    bad = 0
    for key, value in ranks.items():
        item = parse(value) if str(key).isdigit() else None
        if item is None:
            bad += 1
        else:
            out[int(key)] = item
    if bad:
        problems.append(f"{path}: {bad} malformed rank entr{'y' if bad == 1 else 'ies'} ignored")
    return out
