"""Where a rank runs: its host, node, process id and local rank.

One model for every source that knows it (the live agent's payload today; a ranks map,
file names or a scheduler's environment can fill the same record), so the verdict, the
spans, the reports and the incident file all say "rank 2 (host vm, pid 4242)" the same
way. Plain data, no torch.

The agent's payload carries it under :data:`PAYLOAD_KEY` as
``{"host": str, "node": str, "pid": int, "local_rank": int, "address": str, "metrics_port": int}``;
dumps are untrusted, so :func:`process_from_raw` keeps only well-typed values.

``address`` is the IP address the rank's peers reach its host at (the local end of its route to
the job's store) and ``metrics_port`` its ``/metrics`` port: a node that lost its peers probes
them there, because a host name need not resolve on the other hosts (Kubernetes pods).

Host and node names must be host names (:func:`fr_otel.common.names.host_name`): they end up
in commands people paste (``ssh node7 py-spy dump``), so anything else is read as unknown.

``host`` is always the socket host name (what DCGM and node exporters label metrics
with, so joins work); ``node`` is the scheduler's name for the machine where one says
(Slurm's ``SLURMD_NODENAME``), which is what people type into ``scontrol``/``sinfo``:
culprits are grouped by node under that name when it is known.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from ..common.names import host_name

__all__ = ["PAYLOAD_KEY", "RankProcess", "bad_names", "ip_address", "process_from_raw"]

#: Top-level key of a dump (as the live agent sends it) that says where the rank ran.
PAYLOAD_KEY = "fr_otel_process"


@dataclass(frozen=True, slots=True)
class RankProcess:
    """Where one rank ran; every field is None when no source said."""

    host: str | None = None
    pid: int | None = None
    local_rank: int | None = None
    source: str = ""  # who said so: "agent", ...
    node: str | None = None  # the scheduler's node name (Slurm), when it differs in kind from the socket host
    ip: str | None = None  # the IP address peers reach its host at (its route to the job's store): JSON "address"
    metrics_port: int | None = None  # its /metrics port, where peers probe whether its host still answers

    @property
    def probe_at(self) -> tuple[str, int] | None:
        """``(address, port)`` a peer probes it at, when it published both."""
        return (self.ip, self.metrics_port) if self.ip and self.metrics_port else None

    @property
    def known(self) -> bool:
        return self.host is not None or self.pid is not None or self.node is not None

    @property
    def place(self) -> str | None:
        """The name culprits are grouped under: the scheduler's node name, else the host."""
        return self.node or self.host

    @property
    def label(self) -> str:
        """``host vm, node n01, pid 4242`` (only the parts known; node only when not the host)."""
        parts = ([f"host {self.host}"] if self.host else []) + (
            [f"node {self.node}"] if self.node and self.node != self.host else []) + (
            [f"pid {self.pid}"] if self.pid is not None else [])
        return ", ".join(parts)

    @property
    def address(self) -> str:
        """``vm:4242`` for log lines ("" when neither is known)."""
        if not self.known:
            return ""
        return f"{self.host or '?'}:{self.pid if self.pid is not None else '?'}"

    def as_json(self) -> dict[str, Any]:
        """The JSON shape (also the payload's): only known fields."""
        out: dict[str, Any] = {}
        if self.host is not None:
            out["host"] = self.host
        if self.node is not None:
            out["node"] = self.node
        if self.pid is not None:
            out["pid"] = self.pid
        if self.local_rank is not None:
            out["local_rank"] = self.local_rank
        if self.ip is not None:
            out["address"] = self.ip
        if self.metrics_port is not None:
            out["metrics_port"] = self.metrics_port
        return out


def process_from_raw(info: Any, source: str) -> RankProcess | None:
    """A :class:`RankProcess` from untrusted JSON/pickle data; None when it says nothing usable."""
    if not isinstance(info, dict):
        return None
    process = RankProcess(host=host_name(info.get("host")), pid=_non_negative(info.get("pid")),
                          local_rank=_non_negative(info.get("local_rank")), source=source,
                          node=host_name(info.get("node")), ip=ip_address(info.get("address")),
                          metrics_port=_port(info.get("metrics_port")))
    return process if process.known else None


def ip_address(value: Any) -> str | None:
    """``value`` as a canonical IPv4 or IPv6 address literal, else None (never a name: nothing to resolve)."""
    if type(value) is not str or len(value) > 64:
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return None


def _port(value: Any) -> int | None:
    return value if type(value) is int and 0 < value < 1 << 16 else None


def bad_names(info: Any) -> int:
    """How many of ``info``'s ``host`` and ``node`` are there but are not host names (read as
    unknown by :func:`process_from_raw`): a side file reports them in one line."""
    if not isinstance(info, dict):
        return 0
    return sum(1 for key in ("host", "node") if info.get(key) is not None and host_name(info[key]) is None)


def _non_negative(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value < 1 << 31 else None
