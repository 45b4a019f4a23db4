"""What a recorder entry means, decided once: its backend, whether it completed, which send/recv it is.

Every reader of recorder entries asks these rules: the validator (:mod:`.validate`), the column
builder (:mod:`.columns`, and its C scan, whose contract is these rules on canonical input), the
live agent's own recorder reads, the payload it sends, and the analysis of send/recv.

- **Backend**: the prefix of an entry's ``profiling_name`` (``gloo:all_reduce``, ``nccl:send 1->2``;
  torchcomms' and other backends' prefixes are free text); a dump records one backend.
- **Completed**: NCCL says ``state == "completed"``; gloo never leaves ``scheduled`` and signals
  progress by retiring the entry, so a gloo entry is completed when retired. Decided per dump
  (or per live recorder: :func:`completion_rule`), from its backend.
- **Send/recv**: ``send A->B`` and ``recv A<-B`` name the recording rank's group-local rank A and
  its peer's B (``?``: any source).
- **The default group**: ``desc == "default_pg"``; gloo (torch 2.13) records its config before the
  group has a name, as the world's ranks under ``''`` at best.
- **Slots**: an entry's ``pg_id`` is its process's slot for the group, numbered in the order the
  process created its groups (:func:`creation_order`); slots differ between ranks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from ..common.text import printable

__all__ = ["DEFAULT_PG_DESC", "P2PName", "backend_of", "completed", "completion_rule", "creation_order",
           "done_flags", "is_default_group", "p2p_name", "raw_completed", "unnamed_world"]

DEFAULT_PG_DESC = "default_pg"
_P2P_NAME = re.compile(r"(send|recv) (\d+)(?:->|<-)(\d+|\?)$")


def backend_of(raw_entries: Iterable[Any], comm_lib: str = "") -> str:
    """The backend a dump's entries were recorded by (their ``profiling_name`` prefix); ``nccl``
    for a dump with a communication library version and no usable entry, else ``unknown``."""
    for e in raw_entries:
        if isinstance(e, dict) and isinstance(e.get("profiling_name"), str) and ":" in e["profiling_name"]:
            return printable(e["profiling_name"].split(":", 1)[0])
    return "nccl" if comm_lib else "unknown"


def completed(state: Any, retired: Any, gloo: bool) -> bool:
    """The completion rule for one entry of a dump of backend gloo (``gloo``) or any other."""
    return retired is True if gloo else state == "completed"


def raw_completed(entry: Mapping[str, Any], gloo: bool) -> bool:
    """:func:`completed` for an entry as the recorder returns it (a dict)."""
    return completed(entry.get("state", "scheduled"), entry.get("retired", False), gloo)


def completion_rule(entries: Iterable[Any]) -> Callable[[Mapping[str, Any]], bool]:
    """:func:`raw_completed` for the entries of one recorder (one backend, decided as a dump's
    is by :func:`backend_of`): what the live agent asks of its own recorder's entries."""
    gloo = backend_of(entries) == "gloo"
    return lambda entry: raw_completed(entry, gloo)


def done_flags(values: Iterable[Any], gloo: bool) -> bytes:
    """:func:`completed` for a column: each entry's ``retired`` (gloo) or ``state`` (others), as 0/1
    bytes. A value of the wrong type raises TypeError (the caller's slow path validates it)."""
    return bytes(values if gloo else map("completed".__eq__, values))


class P2PName(NamedTuple):
    """``send 1->2``: this rank's group-local rank 1 sends to group-local rank 2 (``peer`` None: any source)."""

    kind: str  # "send" | "recv"
    local: int
    peer: int | None


def p2p_name(name: str) -> P2PName | None:
    """The send/recv an op name (``send 1->2``, ``nccl:recv 2<-?``) says, or None when it is not one."""
    m = _P2P_NAME.search(name)
    if m is None:
        return None
    return P2PName(m.group(1), int(m.group(2)), None if m.group(3) == "?" else int(m.group(3)))


def creation_order(name: str) -> int | None:
    """Where a group stands in its process's creation order, by its name (torch names groups
    "0", "1", ... as they are created), or None for a user-chosen name. The recorder numbers a
    process's slots (``pg_id``) in that same order, skipping groups it is not a member of: so
    slots a dump's entries never name can be paired with groups by this order (the job model
    does), and the live agent numbers the groups it enumerates the same way."""
    return int(name) if name.isdigit() else None


def is_default_group(name: str, desc: str) -> bool:
    """The job's default (world) group, as a dump names it."""
    return desc == DEFAULT_PG_DESC


def unnamed_world(name: str, ranks: tuple[int, ...] | None) -> bool:
    """gloo (torch 2.13) records the world's config under an empty name, before the group has one."""
    return not name and bool(ranks) and ranks == tuple(range(len(ranks or ())))
