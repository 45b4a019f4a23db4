"""What a watcher exported, remembered in a small JSON file beside the dumps.

Each incident is kept with the files it took (name, mtime, size), so a restarted watcher
does not export them again, while dumps overwritten by a restarted job that fails again
form a new incident. The file is untrusted input like any dump: a bad one is set aside
(``.bad``) and the watcher starts afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..common.log import logger
from ..common.files import FileTooLarge, NotRegularFile, atomic_write, read_regular
from ..common.text import one_line, printable
from ..common.export_status import ExportStatus

__all__ = ["MAX_REMEMBERED", "STATE_NAME", "Incident", "Signature", "incident_key", "load_state", "save_state"]

STATE_NAME = ".fr-otel-watch.json"
_STATE_VERSION = 1
MAX_REMEMBERED = 64  # incidents kept in the state file

_log = logger("fr_otel.watch")

Signature = tuple[str, int, int]  # (file name, mtime_ns, size)


def incident_key(signatures: list[Signature] | set[Signature]) -> str:
    """A short hash of the incident's files: the same files give the same key, on any host."""
    h = hashlib.blake2b(digest_size=8)
    for name, mtime_ns, size in sorted(signatures):
        h.update(f"{name}\0{mtime_ns}\0{size}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


#: The export statuses an incident is done with (its trace is where the user asked for it).
_ARRIVED = frozenset(str(s) for s in ExportStatus if s.arrived)


@dataclass(slots=True)
class Incident:
    """One exported incident, as remembered in the state file."""

    number: int
    key: str
    trace_id: str = ""
    status: str = "exporting"  # exporting | sent | file | partial | spooled | failed | disabled | error
    destination: str = ""
    spool_path: str | None = None
    reason: str = ""  # complete | deadline
    verdict: str = ""
    culprits: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    late_ranks: list[int] = field(default_factory=list)  # arrived after the export; not exported again
    files: list[list[Any]] = field(default_factory=list)  # [name, mtime_ns, size]
    exported_at: float = 0.0  # wall clock

    @property
    def ok(self) -> bool:
        """Delivered or written (what ``fr-otel export`` exits 0 for)."""
        return self.status in _ARRIVED

    @property
    def signatures(self) -> set[Signature]:
        return {(str(n), int(m), int(s)) for n, m, s in self.files}

    @classmethod
    def from_json(cls, doc: Any) -> Incident:
        """One remembered incident; ValueError when any field has the wrong type."""
        if not isinstance(doc, dict):
            raise ValueError(f"an incident is a {type(doc).__name__}, not an object")
        values: dict[str, Any] = {}
        for name, check in _INCIDENT_FIELDS.items():
            if name in doc:
                if not check(doc[name]):
                    raise ValueError(f"incident field {name!r} has a bad value")
                values[name] = doc[name]
        if "number" not in values or "key" not in values:
            raise ValueError("an incident needs 'number' and 'key'")
        return cls(**values)


def _is_int(v: Any) -> bool:
    return type(v) is int and -(2**63) <= v < 2**63


def _int_list(v: Any) -> bool:
    return type(v) is list and all(map(_is_int, v))


def _is_file_sig(v: Any) -> bool:
    return type(v) is list and len(v) == 3 and type(v[0]) is str and _is_int(v[1]) and _is_int(v[2])


_INCIDENT_FIELDS: dict[str, Callable[[Any], bool]] = {
    "number": lambda v: _is_int(v) and v >= 1,
    "key": lambda v: type(v) is str,
    "trace_id": lambda v: type(v) is str,
    "status": lambda v: type(v) is str,
    "destination": lambda v: type(v) is str,
    "spool_path": lambda v: v is None or type(v) is str,
    "reason": lambda v: type(v) is str,
    "verdict": lambda v: type(v) is str,
    "culprits": _int_list,
    "ranks": _int_list,
    "missing": _int_list,
    "late_ranks": _int_list,
    "files": lambda v: type(v) is list and all(map(_is_file_sig, v)),
    "exported_at": lambda v: type(v) in (int, float) and v >= 0,
}
_MAX_STATE_BYTES = 16 << 20


def _parse_state(doc: Any) -> list[Incident]:
    if not isinstance(doc, dict) or type(doc.get("incidents")) is not list:
        raise ValueError("not a watch state (no 'incidents' list)")
    incidents = [Incident.from_json(i) for i in doc["incidents"]]
    if len({i.number for i in incidents}) != len(incidents):
        raise ValueError("two incidents share a number")
    return incidents


def load_state(path: Path) -> list[Incident]:
    """The incidents remembered in ``path``; none (and one log line) when it is absent,
    unreadable or invalid; an invalid file is kept as ``<name>.bad``."""
    data: bytes | None
    try:
        data = read_regular(path, _MAX_STATE_BYTES)  # a FIFO planted as the state file must not block the watcher
    except FileNotFoundError:
        return []
    except NotRegularFile:
        _log.info("%s: not a regular file; starting afresh without a state file", printable(str(path)))
        return []
    except FileTooLarge:
        data = None  # said, and the file kept as .bad, below
    except OSError as exc:
        _log.info("%s: cannot read the state (%s); starting afresh: dumps present will be exported",
                  printable(str(path)), exc.strerror or exc)
        return []
    try:
        if data is None:
            raise ValueError(f"over {_MAX_STATE_BYTES} bytes")
        return _parse_state(json.loads(data.decode("utf-8")))
    except (ValueError, TypeError, KeyError, RecursionError) as exc:  # JSON and UTF-8 errors are ValueErrors
        copy = path.with_name(f"{path.name}.bad")
        try:
            os.replace(path, copy)
            kept = f"kept as {printable(str(copy))}"
        except OSError:
            kept = "could not keep a copy"
        _log.info("%s: invalid state (%s); %s; starting afresh: dumps present will be exported",
                  printable(str(path)), one_line(exc, 120), kept)
        return []


def save_state(path: Path, incidents: list[Incident]) -> None:
    """Write the newest :data:`MAX_REMEMBERED` incidents to ``path`` atomically (OSError when it cannot)."""
    doc = {"version": _STATE_VERSION, "incidents": [asdict(i) for i in incidents[-MAX_REMEMBERED:]]}
    atomic_write(path, (json.dumps(doc, indent=1) + "\n").encode("utf-8", "backslashreplace"))
