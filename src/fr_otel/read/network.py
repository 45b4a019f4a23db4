"""What one node saw of the network at incident time: the job's store, and which other hosts answered.

Dumps cannot tell a lost host from one that is cut off: from the inside both look like "every
peer went silent". The agent that coordinates an incident therefore records what it saw: whether
the job's store (and on which host it lives) still answered, since when it did not, and which
other hosts' agents answered a connection attempt, at which address each was tried, and which
could not be tried at all (no address published, a name that does not resolve: "not probed",
which says nothing about that host). The analysis weighs it
(:mod:`fr_otel.diagnosis.hosts`); ``incident.json`` keeps it (key ``network``), so an offline
analysis of the folder says the same. Untrusted data when read back: only well-typed values stay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..common.names import host_name
from ..common.text import printable

__all__ = ["PAYLOAD_KEY", "NetworkFacts", "network_from_raw"]

#: Key of the facts in ``incident.json``.
PAYLOAD_KEY = "network"
_MAX_PROBES = 4096


@dataclass(frozen=True, slots=True)
class NetworkFacts:
    """The network as the incident's coordinator (on host ``seen_from``) saw it."""

    seen_from: str
    store_address: str = ""  # host:port of the job's store (MASTER_ADDR:MASTER_PORT)
    store_host: str | None = None  # which of the job's hosts runs it, when known
    #: Wall clock (ns) since which the store has not answered this node; None: it answers.
    store_silent_since_ns: int | None = None
    #: Host -> did its agent answer a connection attempt from ``seen_from`` (only hosts probed).
    answered: dict[str, bool] = field(default_factory=dict)
    #: Host -> the ``address:port`` it was probed at.
    probed: dict[str, str] = field(default_factory=dict)
    #: Host -> why it could not be probed (no address, its name does not resolve): not an answer either way.
    not_probed: dict[str, str] = field(default_factory=dict)

    @property
    def store_lost(self) -> bool:
        return self.store_silent_since_ns is not None

    def as_json(self) -> dict[str, Any]:
        return {"seen_from": self.seen_from, "store_address": self.store_address, "store_host": self.store_host,
                "store_silent_since_ns": self.store_silent_since_ns, "answered": dict(sorted(self.answered.items())),
                "probed": dict(sorted(self.probed.items())), "not_probed": dict(sorted(self.not_probed.items()))}


def network_from_raw(raw: Any) -> NetworkFacts | None:
    """:class:`NetworkFacts` from untrusted JSON; None when it says nothing usable."""
    if not isinstance(raw, dict):
        return None
    seen_from = host_name(raw.get("seen_from"))
    if seen_from is None:
        return None
    address = raw.get("store_address")
    since = raw.get("store_silent_since_ns")
    answered = raw.get("answered")
    probes = {h: v for h, v in list(answered.items())[:_MAX_PROBES] if host_name(h) and type(v) is bool} \
        if isinstance(answered, dict) else {}
    return NetworkFacts(
        seen_from,
        printable(address)[:300] if isinstance(address, str) else "",
        host_name(raw.get("store_host")),
        since if type(since) is int and 0 < since < 1 << 63 else None,
        probes,
        _host_texts(raw.get("probed"), 64),
        {h: why for h, why in _host_texts(raw.get("not_probed"), 200).items() if h not in probes},
    )


def _host_texts(raw: Any, limit: int) -> dict[str, str]:
    """Host -> a short printable text, from untrusted JSON (other entries dropped)."""
    if not isinstance(raw, dict):
        return {}
    return {h: printable(v)[:limit] for h, v in list(raw.items())[:_MAX_PROBES] if host_name(h) and isinstance(v, str)}
