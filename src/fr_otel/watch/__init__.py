"""Wait for a job's Flight Recorder dumps on disk; analyse and export each incident once.

The loop (:mod:`.watcher`) follows dump files until they settle and parse; the export step
(:mod:`.incident_export`) analyses an incident and delivers its trace; what was exported is
remembered across restarts (:mod:`.state`); where to look and how long to wait:
:mod:`.settings`. Nothing here raises on bad files, a missing directory or a collector
that is down. Importing this package loads neither the OpenTelemetry SDK nor grpc.
"""

from __future__ import annotations

from .settings import (
    DEFAULT_DEADLINE_S,
    DEFAULT_DUMP_PREFIX,
    DEFAULT_POLL_S,
    DEFAULT_SETTLE_S,
    DUMP_PREFIX_ENVS,
    WatchSettings,
    dump_location,
    parse_rank_set,
)
from .state import STATE_NAME, Incident, incident_key
from .watcher import DumpWatcher

__all__ = [
    "DEFAULT_DEADLINE_S",
    "DEFAULT_DUMP_PREFIX",
    "DEFAULT_POLL_S",
    "DEFAULT_SETTLE_S",
    "DUMP_PREFIX_ENVS",
    "STATE_NAME",
    "DumpWatcher",
    "Incident",
    "WatchSettings",
    "dump_location",
    "incident_key",
    "parse_rank_set",
]
