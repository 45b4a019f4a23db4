"""A rank's last record: the node-local copy of its recorder state, read when the rank itself sends nothing.

The rank the others wait for is often the one that cannot hand over its recorder (its GIL held, stopped,
killed). Its agent keeps a small copy of its recorder's state on its node (:mod:`fr_otel.agent.observe.last_record`)
that its host-mates can read after it stops answering; an incident loads it for a rank that sends no part.
Such a dump carries, under :data:`RECORD_KEY`, when the copy was taken, by which process, when its agent last
vouched for it, and when the rank was last heard from: the verdict says its kind comes from that record and
how old the record was when the rank went silent. Untrusted like any dump: :func:`record_from_raw` keeps
only well-typed, bounded values. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RECORD_KEY", "LastRecord", "record_from_raw"]

#: Top-level key of a dump built from a rank's node-local copy (and only of such a dump).
RECORD_KEY = "fr_otel_last_record"
_MAX_NS = 1 << 63


def _ns(value: Any) -> int | None:
    return value if type(value) is int and 0 < value < _MAX_NS else None


@dataclass(frozen=True, slots=True)
class LastRecord:
    """When a rank's node-local copy was taken and vouched for, when the rank went silent, and when it was loaded."""

    taken_ns: int  # when its agent last wrote it (its recorder's state changed then)
    pid: int | None = None  # the process whose agent wrote it
    confirmed_ns: int | None = None  # the last time its agent found it unchanged (the file's time)
    silent_since_ns: int | None = None  # the rank's last heartbeat, as the incident that loaded it knew it
    loaded_ns: int | None = None  # when the incident loaded it

    @property
    def as_of_ns(self) -> int:
        """The latest moment the copy is known to hold: its agent's last word on it."""
        return max(self.taken_ns, self.confirmed_ns or 0)

    @property
    def age_s(self) -> float | None:
        """How old the record was when the incident loaded it (None: not known)."""
        if self.loaded_ns is None:
            return None
        return max(self.loaded_ns - self.as_of_ns, 0) / 1e9

    def said(self) -> str:
        """``its last record, 4.2 s old (its agent's last word before it stopped answering)``."""
        age = self.age_s
        return "its last record" + (f", {age:.1f} s old" if age is not None else "") + \
            " (its agent's last word before it stopped answering)"

    def as_json(self) -> dict[str, Any]:
        return {"taken_ns": self.taken_ns, "pid": self.pid, "confirmed_ns": self.confirmed_ns,
                "silent_since_ns": self.silent_since_ns, "loaded_ns": self.loaded_ns}


def record_from_raw(value: Any) -> LastRecord | None:
    """A :class:`LastRecord` from untrusted data; None without a believable ``taken_ns``."""
    if not isinstance(value, dict):
        return None
    taken = _ns(value.get("taken_ns"))
    if taken is None:
        return None
    pid = value.get("pid")
    confirmed = _ns(value.get("confirmed_ns"))
    return LastRecord(taken, pid if type(pid) is int and 0 < pid < 1 << 31 else None,
                      confirmed if confirmed is not None and confirmed >= taken else None,
                      _ns(value.get("silent_since_ns")), _ns(value.get("loaded_ns")))
