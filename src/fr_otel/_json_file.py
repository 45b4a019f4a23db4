"""Small JSON files beside the dumps (``ranks.json``, ``steps.json``): read bounded, fail in one line."""

from __future__ import annotations

import json
from typing import Any

from ._text import one_line

__all__ = ["read_json_file"]

_MAX_FILE_BYTES = 64 << 20  # a map of 100k ranks is ~20 MB


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
