"""Names taken from untrusted places: host names and incident identities, each with one rule.

A host name ends up in a command a person pastes (``ssh node7 py-spy dump --pid 4242``), in
span attributes and on the terminal; a job id or incident key ends up in trace ids, resource
attributes and on the terminal. They come from dump file names, side files beside the dumps
(``ranks.json``, ``incident.json``), an agent's payload, flags and environment variables. So
each kind is checked here, once, wherever it enters: ``node7 $(touch /tmp/x)`` is not a host,
``job\\x1b]0;pwned\\x07`` and a lone surrogate are not a job id.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["HOST_NAME", "MAX_IDENTITY", "host_name", "identity_problem", "is_trace_id"]

#: A host name: letters, digits, dots, dashes and underscores (some clusters use them), starting
#: and ending with a letter or digit, at most 253 characters (DNS). Nothing a shell interprets.
HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")
#: Longest job id or incident key accepted (real ones: a Slurm or torchelastic id, ``store:<uuid>``).
MAX_IDENTITY = 256
_TRACE_ID = re.compile(r"[0-9a-f]{32}")


def host_name(value: Any) -> str | None:
    """``value`` if it is a host name by :data:`HOST_NAME`, else None."""
    return value if type(value) is str and HOST_NAME.fullmatch(value) else None


def identity_problem(value: Any, what: str = "job id") -> str | None:
    """Why ``value`` cannot be a job id or incident key (``what``), or None when it can: a
    string of at most :data:`MAX_IDENTITY` printable characters (no control or format
    characters, no lone surrogates), not starting or ending with a space."""
    if type(value) is not str:
        return f"the {what} is not a string"
    if len(value) > MAX_IDENTITY:
        return f"the {what} is longer than {MAX_IDENTITY} characters"
    if not value.isprintable():
        return f"the {what} holds control characters, format characters or invalid text"
    if value != value.strip():
        return f"the {what} starts or ends with a space"
    return None


def is_trace_id(value: Any) -> bool:
    """A 128-bit trace id in lower-case hex, not all zeros (backends drop that one)."""
    return type(value) is str and bool(_TRACE_ID.fullmatch(value)) and value != "0" * 32
