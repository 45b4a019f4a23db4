"""``StrEnum`` on every supported Python: a vocabulary whose members are also the strings they stand for.

The verdict words, culprit kinds and export statuses are part of the public JSON schema and
the span attributes: as members of a ``StrEnum`` they compare and serialise as those very
strings, while the type checker finds every place that must handle a new member.
"""

from __future__ import annotations

import enum
import sys

__all__ = ["StrEnum"]

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        """Python 3.11's ``enum.StrEnum``: ``str(member)`` is its value."""

        def __str__(self) -> str:
            return str(self.value)
