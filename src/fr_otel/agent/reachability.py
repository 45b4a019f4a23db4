"""Who answers from here: the job's store's host, and the other hosts' agents, each tried for a moment.

From inside one node a lost peer and a lost self look the same: every peer goes silent. One
bounded connection attempt to each other host's agent (its ``/metrics`` port) tells them apart:
if no host answers, this node is the one cut off; if some do, the silent ones are lost. And a
rank knows whether its own host runs the job's store by trying to bind the store's address (only
an address of one's own interfaces binds). Every attempt is bounded and runs on its own daemon
thread: nothing here can hold the training process.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping

from ..read.network import NetworkFacts

__all__ = ["MAX_PROBED", "holds_address", "network_facts", "probe"]

#: Hosts tried at most per incident: the silent ones first, then others to tell "cut off" from "lost".
MAX_PROBED = 16

_RESOLVE_TIMEOUT_S = 2.0


def _resolve(host: str) -> str | None:
    """An IPv4 address of ``host``, or None (looked up on a daemon thread, at most 2 s)."""
    out: list[str] = []

    def look() -> None:
        try:
            out.append(socket.gethostbyname(host))
        except (OSError, UnicodeError, ValueError):  # not a name the resolver takes (a label over 63 bytes...)
            pass

    worker = threading.Thread(target=look, name="fr-otel-resolve", daemon=True)
    worker.start()
    worker.join(_RESOLVE_TIMEOUT_S)
    return out[0] if out else None


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


def probe(targets: Mapping[str, int], timeout_s: float = 1.0) -> dict[str, bool]:
    """Host -> whether a TCP connection to ``host:port`` opened within ``timeout_s`` (all tried at once)."""
    results: dict[str, bool] = {}
    lock = threading.Lock()

    def attempt(host: str, port: int) -> None:
        ok = False
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                ok = True
        except (OSError, UnicodeError, ValueError, OverflowError):  # unreachable, or no name or port at all
            ok = False
        with lock:
            results[host] = ok

    workers = [threading.Thread(target=attempt, args=item, name="fr-otel-probe", daemon=True)
               for item in targets.items()]
    for w in workers:
        w.start()
    end = time.monotonic() + timeout_s + _RESOLVE_TIMEOUT_S
    for w in workers:
        w.join(max(0.0, end - time.monotonic()))
    with lock:
        return {host: results.get(host, False) for host in targets}


def network_facts(here: str | None, port: int | None, store_address: str, store_host: str | None,
                  store_silent_since_ns: int | None, known_hosts: set[str], silent_hosts: set[str]) -> NetworkFacts | None:
    """What this node (``here``) sees of the network now: the store (answering or since when not) and
    which of the silent hosts' agents (plus a few answering ones, for contrast) accept a connection on
    ``port``. None when this node does not know its own host name."""
    if not here:
        return None
    chosen = sorted(silent_hosts - {here})[:MAX_PROBED]
    chosen += [h for h in sorted(known_hosts - {here}) if h not in chosen][: max(0, MAX_PROBED - len(chosen))]
    answered = probe({h: port for h in chosen}) if port and chosen else {}
    return NetworkFacts(here, store_address, store_host, store_silent_since_ns, answered)
