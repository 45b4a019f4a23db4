"""Who answers from here: the job's store's host, and the other hosts' agents, each tried for a moment.

From inside one node a lost peer and a lost self look the same: every peer goes silent. One
bounded connection attempt to each other host's agent (its ``/metrics`` port) tells them apart:
if no host answers, this node is the one cut off; if some do, the silent ones are lost.

A host is probed at the address its ranks published at start-up (:func:`local_address`: the
local end of their route to the job's store, which the other hosts reach too), not by name: in
many clusters (Kubernetes pods) a host name does not resolve on the other hosts, and a name that
does not resolve says nothing about the host. A host with no published address is tried by name;
one whose name does not resolve either is "not probed": no answer either way, and never a reason
for a node to think itself cut off.

A rank knows whether its own host runs the job's store by trying to bind the store's address
(only an address of one's own interfaces binds). Every attempt is bounded and runs on its own
daemon thread: nothing here can hold the training process.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ...read.network import NetworkFacts
from ...read.rank_process import RankProcess, ip_address

__all__ = ["MAX_PROBED", "NOT_RESOLVED", "Probe", "holds_address", "local_address", "network_facts", "probe",
           "probe_targets", "reachable_at"]

#: Hosts tried at most per incident: the silent ones first, then others to tell "cut off" from "lost".
MAX_PROBED = 16
#: Why a host was not probed: it published no address and its name does not resolve here.
NOT_RESOLVED = "no address published, and its name does not resolve here"

_RESOLVE_TIMEOUT_S = 2.0


def _lookup(host: str) -> str | None:
    """``host``'s IPv4 address, looked up on the calling thread; None when it does not resolve."""
    try:
        return socket.gethostbyname(host)
    except (OSError, UnicodeError, ValueError):  # not a name the resolver takes (a label over 63 bytes...)
        return None


def _resolve(host: str) -> str | None:
    """An IPv4 address of ``host``, or None (looked up on a daemon thread, at most 2 s)."""
    out: list[str | None] = []
    worker = threading.Thread(target=lambda: out.append(_lookup(host)), name="fr-otel-resolve", daemon=True)
    worker.start()
    worker.join(_RESOLVE_TIMEOUT_S)
    return out[0] if out else None


def _split(address: str) -> tuple[str, int | None]:
    """``host:port`` (``[v6]:port``) -> host and port (None when it has none)."""
    host, sep, port = address.rpartition(":")
    if not sep:
        return address, None
    return host.strip("[]"), int(port) if port.isdigit() else None


def local_address(store_address: str) -> str | None:
    """The address this host's route to the job's store (``host:port``) leaves from: the address the
    other hosts, which reach the same store, can reach this one at. A UDP socket's ``connect`` only
    picks the route; nothing is sent. None when it cannot say (no store address, a name that does not
    resolve, no route)."""
    host, port = _split(store_address)
    if not host:
        return None
    ip = ip_address(host) or _resolve(host)
    if ip is None:
        return None
    try:
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, port or 9))
            mine = ip_address(s.getsockname()[0])
    except OSError:
        return None
    return mine if mine not in (None, "0.0.0.0", "::") else None


def reachable_at(process: RankProcess, store_address: str, served: tuple[str, int] | None) -> RankProcess:
    """``process`` with the address and ``/metrics`` port its peers probe it at (what it publishes in
    the host map): the address its ``/metrics`` listens on when that is one address, else the local end
    of its route to the store; no port when nothing serves, or only on loopback (peers cannot reach it)."""
    bound, port = served if served is not None else ("", None)
    ip = ip_address(bound)
    if ip is not None and ipaddress.ip_address(ip).is_loopback:
        return replace(process, ip=local_address(store_address), metrics_port=None)
    if ip is None or ipaddress.ip_address(ip).is_unspecified:
        ip = local_address(store_address)
    return replace(process, ip=ip, metrics_port=port)


def holds_address(host: str) -> bool:
    """True when ``host`` (the store's MASTER_ADDR) is an address of this machine's own interfaces."""
    if host in ("localhost", socket.gethostname()):
        return True
    ip = _resolve(host)
    if ip is None:
        return False
    if ip.startswith("127."):
        return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, 0))  # binds only to an address this host owns
        except OSError:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Probe:
    """Where to try one host: the address it published, else (``by_name``) its name, resolved here."""

    host: str
    at: str
    port: int
    by_name: bool = False


def probe_targets(hosts: list[str], processes: Mapping[int, RankProcess], fallback_port: int | None
                  ) -> tuple[list[Probe], dict[str, str]]:
    """How to probe each of ``hosts``: at the address and ``/metrics`` port its lowest local rank
    published (``processes``: the host map), else by name on ``fallback_port`` (the configured base
    port); and the hosts that cannot be probed at all, with why."""
    published: dict[str, tuple[int, str, int]] = {}
    for p in processes.values():
        at = p.probe_at
        if p.host and at is not None:
            key = (p.local_rank if p.local_rank is not None else 1 << 31, *at)
            if p.host not in published or key < published[p.host]:
                published[p.host] = key
    targets: list[Probe] = []
    skipped: dict[str, str] = {}
    for host in hosts:
        if host in published:
            targets.append(Probe(host, published[host][1], published[host][2]))
        elif fallback_port:
            targets.append(Probe(host, host, fallback_port, by_name=True))
        else:
            skipped[host] = "no address published, and no /metrics port to try"
    return targets, skipped


def probe(targets: list[Probe], timeout_s: float = 1.0) -> tuple[dict[str, bool], dict[str, str], dict[str, str]]:
    """Try every target at once: host -> whether a TCP connection opened within ``timeout_s``; host ->
    the ``address:port`` tried; host -> why it was not tried (its name does not resolve: "not probed",
    never "did not answer")."""
    answered: dict[str, bool] = {}
    tried: dict[str, str] = {}
    lock = threading.Lock()

    def attempt(target: Probe) -> None:
        ip = ip_address(target.at) or (_lookup(target.at) if target.by_name else None)
        if ip is None:
            return
        with lock:
            tried[target.host] = f"[{ip}]:{target.port}" if ":" in ip else f"{ip}:{target.port}"
        try:
            with socket.create_connection((ip, target.port), timeout=timeout_s):
                ok = True
        except (OSError, UnicodeError, ValueError, OverflowError):  # unreachable, or no name or port at all
            ok = False
        with lock:
            answered[target.host] = ok

    workers = [threading.Thread(target=attempt, args=(t,), name="fr-otel-probe", daemon=True) for t in targets]
    for w in workers:
        w.start()
    end = time.monotonic() + timeout_s + _RESOLVE_TIMEOUT_S
    for w in workers:
        w.join(max(0.0, end - time.monotonic()))
    with lock:  # still connecting at the bound: tried, no answer; never got an address: not probed
        done = {t.host: answered.get(t.host, False) for t in targets if t.host in tried}
        return done, {h: tried[h] for h in done}, {t.host: NOT_RESOLVED for t in targets if t.host not in tried}


def network_facts(here: str | None, processes: Mapping[int, RankProcess], port: int | None, store_address: str,
                  store_host: str | None, store_silent_since_ns: int | None, silent_hosts: set[str]
                  ) -> NetworkFacts | None:
    """What this node (``here``) sees of the network now: the store (answering or since when not) and
    which of the silent hosts' agents (plus a few answering ones, for contrast) accept a connection at
    the address their ranks published (``processes``), else by name on ``port``. None when this node
    does not know its own host name."""
    if not here:
        return None
    known = {p.host for p in processes.values() if p.host}
    chosen = sorted(silent_hosts - {here})[:MAX_PROBED]
    chosen += [h for h in sorted(known - {here}) if h not in chosen][: max(0, MAX_PROBED - len(chosen))]
    targets, skipped = probe_targets(chosen, processes, port)
    answered, tried, unresolved = probe(targets) if targets else ({}, {}, {})
    return NetworkFacts(here, store_address, store_host, store_silent_since_ns, answered, tried,
                        {**skipped, **unresolved})
