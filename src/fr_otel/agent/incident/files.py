"""The incident's files on every node that took part, not only the coordinator's.

The coordinator writes the host map, step map, ``incident.json`` and ``incident.html`` beside the
dumps on its own node. A user who looks at another node's dump folder (the one they can reach,
or the one a node-local watcher reads) must find them there too. So the coordinator puts them
in the store (``i/<k>/files``, zlib'd JSON), and each other node's first local rank fetches them,
bounded, on a daemon thread of its own, and writes them beside its node's dumps. A node whose
folder already has them (a shared file system) writes nothing. What it fetches is inflated through the one
bounded inflate (:mod:`fr_otel.common.inflate`): a few hundred KB in the store (anyone may write it) must
not become gigabytes in a rank's memory or on its disk.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from pathlib import Path

from ...common.inflate import InflatedTooLarge, inflate
from ...common.log import logger
from ...common.files import atomic_write, new_file_mode, own_folder
from ...common.names import host_name
from ...common.text import one_line
from ...incident.files import EXCLUDE_HOSTS_FILE, INCIDENT_FILE, REPORT_FILE
from ...read.rank_map import RANKS_FILE
from ...read.steps import STEPS_FILE
from ..serve.health import run_guarded
from .rank import IncidentRank
from ..guest.process_identity import local_world_size
from ..links.store_link import StoreUnavailable

__all__ = ["FILES", "MAX_FILES_BYTES", "MAX_FILES_INFLATED", "fetch_files_later", "publish_files"]

#: What every node gets, in the order written (incident.json last: its presence means "all here").
FILES = (RANKS_FILE, STEPS_FILE, EXCLUDE_HOSTS_FILE, REPORT_FILE, INCIDENT_FILE)
#: The files travel through the job's store, once per node: beyond this in all (a 100k-rank job's
#: files times 12,500 nodes) they stay on the coordinator's node, and the others are told where.
MAX_FILES_BYTES = 16 << 20
MAX_FILES_BYTES_ALL_NODES = 1 << 30
#: ... and inflated, at most this: what a node inflates (a rank's memory for a moment) and writes.
MAX_FILES_INFLATED = 32 << 20
#: An exclude list naming more hosts than this is no verdict's (a lost rack is a few dozen).
MAX_EXCLUDED_HOSTS = 4096
_KEPT_ON = "fr_otel_kept_on"  # the files' place when they stay on the coordinator's node

log = logger("fr_otel.agent")


def publish_files(me: IncidentRank, k: int, folder: Path) -> None:
    """Put the incident's files (those that exist) in the store for the other nodes."""
    files = {}
    for name in FILES:
        try:
            files[name] = (folder / name).read_text(encoding="utf-8")
        except OSError:
            continue
    text = json.dumps(files).encode("utf-8")
    blob = zlib.compress(text, 6)
    per_node = local_world_size(os.environ) or 1
    nodes = max(len({p.host for p in me.hosts.processes.values() if p.host}), me.world_size // per_node, 1)
    if len(text) > MAX_FILES_INFLATED or len(blob) > MAX_FILES_BYTES or len(blob) * nodes > MAX_FILES_BYTES_ALL_NODES:
        where = f"{me.process.host or '?'}:{folder}"
        log.info("incident %d: its files (%d bytes compressed, for %d nodes) stay on this node: %s", k, len(blob),
                 nodes, where)
        blob = zlib.compress(json.dumps({_KEPT_ON: where}).encode("utf-8"))  # the others stop asking
    me.channel.publish_files(k, blob)


def fetch_files_later(me: IncidentRank, k: int, folder: Path, wait_s: float) -> threading.Thread:
    """On a daemon thread (returned, started): wait (at most ``wait_s``) for the coordinator's files, write
    them into ``folder``."""
    thread = threading.Thread(target=run_guarded, args=(me.health, f"incident {k}: fetching its files", _fetch, me, k,
                                                        folder, time.monotonic() + wait_s), name="fr-otel-files",
                              daemon=True)
    thread.start()
    return thread


def _fetch(me: IncidentRank, k: int, folder: Path, until: float) -> None:
    while time.monotonic() < until:
        if (folder / INCIDENT_FILE).exists():
            return  # the coordinator shares this folder (a shared file system)
        try:
            blob = me.channel.files(k)
        except StoreUnavailable:
            blob = None
        except Exception as exc:  # noqa: BLE001 - a log line, never the training job's problem
            log.debug("incident %d: fetching its files: %s", k, exc)
            return
        if blob is not None:
            _write(k, folder, blob)
            return
        time.sleep(me.config.poll_interval)


def _write(k: int, folder: Path, blob: bytes) -> None:
    try:
        files = json.loads(inflate(blob, MAX_FILES_INFLATED))
    except InflatedTooLarge:
        log.warning("incident %d: its files in the store inflate to over %d bytes (no coordinator sends that: "
                    "forged?); none written into %s", k, MAX_FILES_INFLATED, folder)
        return
    except (ValueError, RecursionError, zlib.error) as exc:
        log.warning("incident %d: its files in the store are not readable (%s); none written into %s", k,
                    one_line(exc, 200), folder)
        return
    try:
        if isinstance(files, dict) and isinstance(files.get(_KEPT_ON), str):
            log.info("incident %d: its verdict and report stay on the coordinator's node, at %s", k,
                     one_line(files[_KEPT_ON], 300))
            return
        checked = {name: text for name in FILES
                   if isinstance(text := files.get(name) if isinstance(files, dict) else None, str)}
        problem = next((p for p in (_problem(name, text) for name, text in checked.items()) if p), None)
        if problem:
            log.warning("incident %d: its files in the store are none a coordinator writes (%s: forged?); none "
                        "written into %s", k, problem, folder)
            return
        own_folder(folder)  # a planted <trace id> link is refused, never written through
        for name, text in checked.items():
            atomic_write(folder / name, text.encode("utf-8"), mode=new_file_mode())
    except (OSError, ValueError, zlib.error) as exc:
        log.warning("incident %d: cannot write its files into %s (%s)", k, folder, exc)
        return
    log.info("incident %d: verdict and report written beside this node's dumps in %s", k, folder)


def _problem(name: str, text: str) -> str | None:
    """Why ``text`` cannot be the coordinator's ``name``, field by field where it has fields; None when it can."""
    if name == EXCLUDE_HOSTS_FILE:
        hosts = text.splitlines()
        if len(hosts) > MAX_EXCLUDED_HOSTS:
            return f"{name} names {len(hosts)} hosts"
        bad = next((h for h in hosts if host_name(h) is None), None)
        return f"{name} holds {one_line(bad, 40)!r}, no host name" if bad is not None else None
    if name.endswith(".json"):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return f"{name} is not JSON"
        return None if isinstance(value, dict) else f"{name} is not a JSON object"
    return None
