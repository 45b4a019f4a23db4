"""Wait for a job's Flight Recorder dumps on disk; analyse and export each incident once.

NCCL dumps every rank on a watchdog timeout to ``<TORCH_FR_DUMP_TEMP_FILE><rank>`` and then
aborts the process. ``DebugInfoWriter::write`` opens that final name with ``std::ofstream``
and writes: no temp file, no rename. So a reader can see a half-written file, and a rank that
dies mid-write leaves a truncated one for good. A file therefore counts as *in* only once its
size and mtime have stood still for a settle time *and* it parses; one that still does not
parse then is reported once and counts as missing until it changes.

An incident is the set of dump files not exported yet. It is exported when every expected rank
is in, or once its first dump is older than the deadline (absent ranks then show as
``missing_dump`` evidence). What was exported is remembered in a small state file (by file
name, mtime and size), so a restarted watcher does not export it again, while dumps overwritten
by a restarted job that fails again form a new incident, numbered, with its own trace id.
Nothing here raises on bad files, a missing directory or a collector that is down.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .common.files import atomic_write
from .common.mounts import is_shared_filesystem
from .common.progress import TerminalProgress
from .common.ranks import compress_ranks
from .common.text import one_line, printable
from .diagnosis.analysis import AnalysisOptions, analyze
from .diagnosis.job import DEFAULT_PG_DESC, build_job
from .incident.delivery import (
    ExportOutcome,
    deliver_trace,
)
from .incident.files import INCIDENT_FILE, REPORT_FILE, write_incident_files
from .otlp.config import ExportConfig
from .read.discovery import attach_sidecars, host_from_name, rank_from_name
from .read.dump import RankDump
from .read.rank_map import RANKS_FILE, add_hosts, read_rank_map, write_rank_map
from .read.reader import ReadResult, read_dump_file
from .trace.options import TraceOptions

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

STATE_NAME = ".fr-otel-watch.json"
#: Where NCCL writes its automatic dumps: the current name first, then the old one; then
#: torchcomms' FlightRecorderHook (JSON, ``<prefix><rank>``, default ``torchcomm_fr_trace_``).
DUMP_PREFIX_ENVS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCHCOMM_FR_DUMP_TEMP_FILE")
DEFAULT_DUMP_PREFIX = "~/.cache/torch/comm_lib_trace_rank_"
DEFAULT_SETTLE_S = 2.0
DEFAULT_DEADLINE_S = 60.0
DEFAULT_POLL_S = 0.5
_STATE_VERSION = 1
_MAX_REMEMBERED = 64  # incidents kept in the state file

_log = logging.getLogger("fr_otel.watch")


def dump_location(
    directory: str | os.PathLike[str] | None, prefix: str | None, env: Mapping[str, str] | None = None
) -> tuple[Path, str | None]:
    """The folder to watch and the dump file name prefix (None: any name ending in a rank).

    Without ``directory`` both come from NCCL's own setting (``TORCH_FR_DUMP_TEMP_FILE``, else
    ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``), else torchcomms' (``TORCHCOMM_FR_DUMP_TEMP_FILE``),
    else torch's default: a path prefix whose dirname is
    the folder and basename the file prefix. With ``directory``, that basename is still used
    when the setting points into the same folder.
    """
    env = os.environ if env is None else env
    setting = next((env[k] for k in DUMP_PREFIX_ENVS if env.get(k)), DEFAULT_DUMP_PREFIX)
    setting_path = Path(os.path.expanduser(setting))
    setting_dir, setting_prefix = (setting_path, "") if setting.endswith(os.sep) else (
        setting_path.parent, setting_path.name)
    if directory is None:
        return setting_dir, prefix if prefix is not None else (setting_prefix or None)
    folder = Path(os.path.expanduser(os.fspath(directory)))
    if prefix is None and setting_prefix and _same_dir(folder, setting_dir):
        prefix = setting_prefix
    return folder, prefix


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def parse_rank_set(text: str) -> frozenset[int]:
    """``"0-7,16-23"`` -> those ranks; ValueError with a readable message otherwise."""
    ranks: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(f"bad rank range {part!r} (want e.g. 0-7,16-23)") from None
        if first < 0 or last < first:
            raise ValueError(f"bad rank range {part!r} (want e.g. 0-7,16-23)")
        ranks.update(range(first, last + 1))
    if not ranks:
        raise ValueError(f"no ranks in {text!r} (want e.g. 0-7,16-23)")
    return frozenset(ranks)


_Signature = tuple[str, int, int]  # (file name, mtime_ns, size)


def incident_key(signatures: list[_Signature] | set[_Signature]) -> str:
    """A short hash of the incident's files: the same files give the same key, on any host."""
    h = hashlib.blake2b(digest_size=8)
    for name, mtime_ns, size in sorted(signatures):
        h.update(f"{name}\0{mtime_ns}\0{size}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class WatchSettings:
    """What to watch and when an incident is ready (seconds throughout)."""

    directory: Path
    prefix: str | None = None
    expected_ranks: frozenset[int] | None = None  # None: the dumps' pg_config world, else only the deadline
    settle_s: float = DEFAULT_SETTLE_S
    deadline_s: float = DEFAULT_DEADLINE_S
    poll_s: float = DEFAULT_POLL_S
    state_path: Path | None = None  # default: directory / STATE_NAME
    out_dir: str | None = None  # embedded file and spools (incident_export's default when None)

    @property
    def state_file(self) -> Path:
        return self.state_path if self.state_path is not None else self.directory / STATE_NAME


@dataclass(slots=True)
class Incident:
    """One exported incident, as remembered in the state file."""

    number: int
    key: str
    trace_id: str = ""
    status: str = "exporting"  # exporting | sent | file | partial | spooled | failed | disabled | error
    destination: str = ""
    spool_path: str | None = None
    reason: str = ""  # complete | deadline
    verdict: str = ""
    culprits: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    late_ranks: list[int] = field(default_factory=list)  # arrived after the export; not exported again
    files: list[list[Any]] = field(default_factory=list)  # [name, mtime_ns, size]
    exported_at: float = 0.0  # wall clock

    @property
    def ok(self) -> bool:
        """Delivered or written (what ``fr-otel export`` exits 0 for)."""
        return self.status in ("sent", "file", "disabled")

    @property
    def signatures(self) -> set[_Signature]:
        return {(str(n), int(m), int(s)) for n, m, s in self.files}

    @classmethod
    def from_json(cls, doc: Any) -> Incident:
        """One remembered incident; ValueError when any field has the wrong type."""
        if not isinstance(doc, dict):
            raise ValueError(f"an incident is a {type(doc).__name__}, not an object")
        values: dict[str, Any] = {}
        for name, check in _INCIDENT_FIELDS.items():
            if name in doc:
                if not check(doc[name]):
                    raise ValueError(f"incident field {name!r} has a bad value")
                values[name] = doc[name]
        if "number" not in values or "key" not in values:
            raise ValueError("an incident needs 'number' and 'key'")
        return cls(**values)


def _is_int(v: Any) -> bool:
    return type(v) is int and -(2**63) <= v < 2**63


def _int_list(v: Any) -> bool:
    return type(v) is list and all(map(_is_int, v))


def _is_file_sig(v: Any) -> bool:
    return type(v) is list and len(v) == 3 and type(v[0]) is str and _is_int(v[1]) and _is_int(v[2])


_INCIDENT_FIELDS: dict[str, Callable[[Any], bool]] = {
    "number": lambda v: _is_int(v) and v >= 1,
    "key": lambda v: type(v) is str,
    "trace_id": lambda v: type(v) is str,
    "status": lambda v: type(v) is str,
    "destination": lambda v: type(v) is str,
    "spool_path": lambda v: v is None or type(v) is str,
    "reason": lambda v: type(v) is str,
    "verdict": lambda v: type(v) is str,
    "culprits": _int_list,
    "ranks": _int_list,
    "missing": _int_list,
    "late_ranks": _int_list,
    "files": lambda v: type(v) is list and all(map(_is_file_sig, v)),
    "exported_at": lambda v: type(v) in (int, float) and v >= 0,
}
_MAX_STATE_BYTES = 16 << 20


def _parse_state(doc: Any) -> list[Incident]:
    if not isinstance(doc, dict) or type(doc.get("incidents")) is not list:
        raise ValueError("not a watch state (no 'incidents' list)")
    incidents = [Incident.from_json(i) for i in doc["incidents"]]
    if len({i.number for i in incidents}) != len(incidents):
        raise ValueError("two incidents share a number")
    return incidents


@dataclass(slots=True)
class _Tracked:
    """A dump file not exported yet, followed from its first sight until it is in (or bad)."""

    name: str
    rank: int
    size: int
    mtime_ns: int
    arrived: float  # wall clock: its mtime or first sight, whichever is earlier
    changed: float  # monotonic: when its size or mtime last changed
    status: str = "settling"  # settling | in | bad
    dump: RankDump | None = None
    world: frozenset[int] | None = None  # the default group's ranks, per this dump's pg_config
    problems: list[str] = field(default_factory=list)

    @property
    def signature(self) -> _Signature:
        return (self.name, self.mtime_ns, self.size)


class DumpWatcher:
    """Polls one folder; exports each incident once. ``poll()`` is one step, ``run()`` the loop."""

    def __init__(
        self,
        settings: WatchSettings,
        export: ExportConfig,
        trace: TraceOptions | None = None,
        analysis: AnalysisOptions | None = None,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        progress: TerminalProgress | None = None,
    ) -> None:
        self.settings = settings
        self._progress = progress or TerminalProgress(enabled=False)
        self.export = export
        self.trace = trace or TraceOptions()
        self.analysis = analysis or AnalysisOptions()
        self._wall = wall
        self._mono = monotonic
        self._tracked: dict[str, _Tracked] = {}
        self._said: set[str] = set()  # messages logged once
        self._open_since: float | None = None  # wall clock of the pending incident's first dump in
        self._first_scan = True
        self.incidents: list[Incident] = []
        self._done: set[_Signature] = set()  # file versions already exported: never again
        self._load_state()

    # -- the loop ------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None, *, once: bool = False) -> Incident | None:
        """Poll until ``stop`` is set (or, with ``once``, the first export); the last export."""
        stop = threading.Event() if stop is None else stop
        last: Incident | None = None
        while not stop.is_set():
            started = self._mono()
            incident = self.poll()
            if incident is not None:
                last = incident
                if once:
                    break
            stop.wait(max(0.0, self.settings.poll_s - (self._mono() - started)))
        return last

    def poll(self) -> Incident | None:
        """Look once: note arrivals, settle files, export an incident that is ready (never raises)."""
        try:
            now_w, now_m = self._wall(), self._mono()
            if not self._scan(now_w, now_m):
                return None
            self._settle(now_m)
            return self._maybe_export(now_w)
        except Exception as exc:  # noqa: BLE001 - a watcher outlives its own surprises
            self._say_once(f"unexpected error, still watching: {type(exc).__name__}: {exc}")
            return None

    # -- steps ---------------------------------------------------------------------------
    def _scan(self, now_w: float, now_m: float) -> bool:
        folder = self.settings.directory
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            self._say_once(f"{folder} does not exist (yet); waiting for it")
            return False
        except OSError as exc:
            self._say_once(f"{folder}: cannot list: {exc.strerror or exc}; retrying")
            return False
        self._said.discard(f"{folder} does not exist (yet); waiting for it")
        state_name = self.settings.state_file.name
        seen: set[str] = set()
        known = 0
        for entry in entries:
            name = entry.name
            if name.startswith(state_name):
                continue
            rank = rank_from_name(name, self.settings.prefix)
            if rank is None:
                continue
            try:
                st = entry.stat()
            except OSError:
                continue  # vanished between listing and stat
            if not stat.S_ISREG(st.st_mode):
                self._say_once(f"{name}: not a regular file; ignored")
                continue
            sig = (name, st.st_mtime_ns, st.st_size)
            if sig in self._done:
                known += 1
                continue
            seen.add(name)
            tracked = self._tracked.get(name)
            if tracked is None:
                arrived = min(now_w, st.st_mtime_ns / 1e9)
                self._tracked[name] = _Tracked(name, rank, st.st_size, st.st_mtime_ns, arrived, now_m)
            elif (tracked.size, tracked.mtime_ns) != (st.st_size, st.st_mtime_ns):
                tracked.size, tracked.mtime_ns, tracked.changed = st.st_size, st.st_mtime_ns, now_m
                tracked.status, tracked.dump, tracked.world, tracked.problems = "settling", None, None, []
        for name in [n for n in self._tracked if n not in seen]:
            gone = self._tracked.pop(name)
            if gone.status == "in":
                _log.info("rank %d: %s disappeared before the incident was exported", gone.rank, name)
        if self._first_scan:
            self._first_scan = False
            if known:
                last = self.incidents[-1].number if self.incidents else 0
                _log.info("%d dump file(s) already exported (last: incident %d); ignoring them until they change",
                          known, last)
        return True

    def _settle(self, now_m: float) -> None:
        arrived: list[_Tracked] = []
        ready = [t for t in self._tracked.values()
                 if t.status == "settling" and now_m - t.changed >= self.settings.settle_s]
        if not ready:
            return
        with self._progress.task("reading dumps", "files") as update:
            dumps = []
            for i, t in enumerate(ready):
                problems: list[str] = []
                dumps.append((read_dump_file(str(self.settings.directory / t.name), t.rank, problems), problems))
                update(i + 1, len(ready))
        for t, (dump, problems) in zip(ready, dumps):
            if dump is not None and dump.file_mtime_ns not in (None, t.mtime_ns):
                t.changed = now_m  # rewritten while we read it: settle again
                continue
            t.problems = problems
            if dump is None:
                t.status = "bad"
                why = problems[0] if problems else f"{t.name}: unreadable"
                _log.info("rank %d: %s; counted as missing until the file changes", t.rank, why)
            else:
                t.status, t.dump, t.world = "in", dump, _config_world(dump)
                arrived.append(t)
        if not arrived:
            return
        ins = self._ins()
        expected = self._expected(ins)
        if self._open_since is None:
            self._open_since = min(t.arrived for t in ins)
            wait = f"ranks {compress_ranks(expected)}" if expected else "the world size (not in the dumps yet)"
            _log.info("incident %d: first dump in; waiting for %s or %gs", self._next_number(ins), wait,
                      self.settings.deadline_s)
        new = {id(t) for t in arrived}
        counted = {t.rank for t in ins if id(t) not in new}
        of = f"/{len(expected)}" if expected else ""
        for t in sorted(arrived, key=lambda t: t.rank):
            counted.add(t.rank)
            have = len(counted & expected) if expected else len(counted)
            _log.info("rank %d in: %s (%s), %d%s ranks in", t.rank, t.name, _size(t.size), have, of)

    def _ins(self) -> list[_Tracked]:
        return [t for t in self._tracked.values() if t.status == "in"]

    def _expected(self, ins: list[_Tracked]) -> frozenset[int] | None:
        """Explicit ranks, else the world the dumps' pg_config describes (when they agree), else None."""
        if self.settings.expected_ranks is not None:
            return self.settings.expected_ranks
        worlds = {t.world for t in ins if t.world}
        if len(worlds) == 1:
            return next(iter(worlds))
        if len(worlds) > 1:
            sizes = ", ".join(sorted({str(len(w)) for w in worlds}))
            self._say_once(f"the dumps disagree on the world ({sizes} ranks): only the deadline applies")
        return None

    def _maybe_export(self, now_w: float) -> Incident | None:
        ins = self._ins()
        if not ins:
            return None
        live = [t for t in self._tracked.values() if t.status != "bad"]
        first = min(t.arrived for t in live)
        expected = self._expected(ins)
        ranks_in = {t.rank for t in ins}
        settling = any(t.status == "settling" for t in self._tracked.values())
        age, deadline = now_w - first, self.settings.deadline_s
        if expected is not None and expected <= ranks_in:
            reason = "complete"
        elif age >= deadline and (not settling or age >= deadline + self.settings.settle_s):
            reason = "deadline"  # a file still being written gets one more settle period
        else:
            return None
        if self._absorb_late(ins):
            return None
        return self._export(self._next_number(ins), reason, expected, now_w)

    def _absorb_late(self, ins: list[_Tracked]) -> bool:
        """Dumps of ranks the last incident missed, written soon after it: its stragglers, not a new one."""
        if not self.incidents or self.incidents[-1].status == "exporting":
            return False
        last = self.incidents[-1]
        ranks = {t.rank for t in ins}
        window = last.exported_at + self.settings.deadline_s
        if not ranks <= set(last.missing) or any(t.mtime_ns / 1e9 > window for t in self._tracked.values()):
            return False
        taken = list(self._tracked.values())
        last.late_ranks = sorted(set(last.late_ranks) | ranks)
        last.files.extend([t.name, t.mtime_ns, t.size] for t in taken)
        self._finish(taken)
        self._save_state()
        _log.info("rank(s) %s arrived after incident %d was exported; not exported again (trace %s)",
                  compress_ranks(ranks), last.number, last.trace_id)
        return True

    def _next_number(self, ins: list[_Tracked]) -> int:
        key = incident_key({t.signature for t in ins})
        for incident in self.incidents:
            if incident.status == "exporting" and incident.key == key:
                return incident.number  # a watcher died mid-export: same number, same trace id
        return max((i.number for i in self.incidents), default=0) + 1

    def _export(self, number: int, reason: str, expected: frozenset[int] | None, now_w: float) -> Incident:
        ins = self._ins()
        # Bad files (and, at the deadline, files still being written) go with it: their ranks are
        # missing. Once complete, a file still being written is some other rank: it waits.
        taken = [t for t in self._tracked.values() if reason == "deadline" or t.status != "settling"]
        key = incident_key({t.signature for t in ins})
        chosen: dict[int, _Tracked] = {}
        problems: list[str] = []
        for t in sorted(ins, key=lambda t: (t.mtime_ns, t.name)):
            if t.rank in chosen:
                problems.append(f"{chosen[t.rank].name}: rank {t.rank} is also claimed by the newer {t.name}; "
                                f"using {t.name}")
            chosen[t.rank] = t
        for t in sorted(taken, key=lambda t: t.name):
            problems.extend(t.problems)
            if t.status == "settling":
                problems.append(f"{t.name}: still being written at the deadline; left out")
        dumps = {r: t.dump for r, t in chosen.items() if t.dump is not None}
        missing = sorted((expected or frozenset()) - set(dumps))
        incident = Incident(number=number, key=key, reason=reason, ranks=sorted(dumps), missing=missing,
                            files=[[t.name, t.mtime_ns, t.size] for t in sorted(taken, key=lambda t: t.name)],
                            exported_at=now_w)
        if reason == "complete":
            _log.info("incident %d complete: %d/%d ranks in", number, len(dumps), len(expected or dumps))
        else:
            lack = f", missing {compress_ranks(missing)}" if missing else ""
            _log.info("incident %d: deadline (%gs) passed with %d ranks in%s", number, self.settings.deadline_s,
                      len(dumps), lack)
        label = f"{self.trace.incident}/watch-{number}" if self.trace.incident else f"watch-{number}"
        try:
            from .trace.spans import (
                build_trace,  # the OpenTelemetry SDK loads only when there is something to export
            )

            self._note_hosts(dumps)
            read = ReadResult(dumps=dumps, problems=problems)
            attach_sidecars(read, [self.settings.directory])  # ranks.json, steps.json, when someone wrote them
            job = build_job(read)
            verdict = analyze(job, self.analysis)
            with self._progress.task("building spans", "ranks") as update:
                trace = build_trace(job, verdict, replace(self.trace, incident=label), progress=update)
        except Exception as exc:  # noqa: BLE001 - one bad incident must not stop the watcher
            incident.status, incident.destination = "error", f"analysis failed: {type(exc).__name__}: {exc}"
            self._record(incident, taken)
            _log.info("incident %d: %s; not exported", number, incident.destination)
            return incident
        incident.trace_id, incident.verdict = trace.trace_id_hex, verdict.verdict
        incident.culprits = [c.rank for c in verdict.culprits]
        incident.missing = sorted(set(missing) | set(verdict.missing_ranks))
        self._record(incident, [], final=False)  # a watcher killed mid-export re-exports under this number
        try:
            with self._progress.task("encoding spans", "spans") as encoded, \
                    self._progress.task("sending spans", "spans") as sent:
                outcome = deliver_trace(trace, self.export, directory=self.settings.out_dir, progress=sent,
                                        encoding=encoded)
        except Exception as exc:  # noqa: BLE001 - recorded as failed, so it is not retried every poll
            outcome = ExportOutcome("failed", f"{type(exc).__name__}: {exc}", None, None)
        incident.status, incident.destination = outcome.status, outcome.destination
        incident.spool_path = str(outcome.path) if outcome.path and outcome.status == "spooled" else None
        self._record(incident, taken)
        try:  # the identity beside the dumps: a later `fr-otel export DIR` gives this same trace id
            write_incident_files(self.settings.directory, job, verdict, trace, outcome)
        except OSError as exc:
            self._say_once(f"{self.settings.directory}: cannot write {INCIDENT_FILE} and {REPORT_FILE} there "
                      f"({exc.strerror or exc}); `fr-otel export` of this folder will not know the trace id")
        culprits = ",".join(map(str, incident.culprits)) or "none"
        head = f"incident {number}: {verdict.verdict}, culprit ranks {culprits}; trace {trace.trace_id_hex} " \
               f"({len(trace.spans)} spans)"
        _log.info("%s %s", head, outcome.describe(len(trace.spans), self.export))
        return incident

    def _note_hosts(self, dumps: dict[int, RankDump]) -> None:
        """Add to ``ranks.json`` beside the dumps each rank's host where this watcher can vouch
        for it: the host in the dump's file name, else this host when the folder is on a local
        disk (then only this machine wrote there). Hosts already in the map stay."""
        folder = self.settings.directory
        path = folder / RANKS_FILE
        seen: list[str] = []
        known = read_rank_map(str(path), seen) if path.is_file() else {}
        if seen:
            return  # unreadable: the analysis reports it; never overwrite what we cannot read
        local = socket.gethostname() if is_shared_filesystem(folder) is False else None
        hosts = {r: h for r, d in dumps.items() if (h := host_from_name(d.path) or local)}
        added = add_hosts(known, hosts, "watch")
        if not added:
            return
        for rank, process in added.items():
            if dumps[rank].process is None:
                dumps[rank].process = process  # this analysis knows it even if the file cannot be written
        try:
            write_rank_map(folder, {**known, **added})
        except OSError as exc:
            self._say_once(f"{path}: cannot write ({exc.strerror or exc}); a later `fr-otel analyze` of the folder "
                           "will not know the ranks' hosts")

    def _record(self, incident: Incident, taken: list[_Tracked], *, final: bool = True) -> None:
        self.incidents = [i for i in self.incidents if i.number != incident.number] + [incident]
        if final:
            self._finish(taken)
        self._save_state()

    def _finish(self, taken: list[_Tracked]) -> None:
        for t in taken:
            self._done.add(t.signature)
            self._tracked.pop(t.name, None)
        self._open_since = None

    # -- state -----------------------------------------------------------------------------
    def _load_state(self) -> None:
        path = self.settings.state_file
        try:
            # O_NONBLOCK: a FIFO planted as the state file must not block the watcher (nor SIGTERM).
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            return
        except OSError as exc:
            _log.info("%s: cannot read the state (%s); starting afresh: dumps present will be exported",
                      printable(str(path)), exc.strerror or exc)
            return
        with open(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                _log.info("%s: not a regular file; starting afresh without a state file", printable(str(path)))
                return
            data = fh.read(_MAX_STATE_BYTES + 1)
        try:
            if len(data) > _MAX_STATE_BYTES:
                raise ValueError(f"over {_MAX_STATE_BYTES} bytes")
            incidents = _parse_state(json.loads(data.decode("utf-8")))
        except (ValueError, TypeError, KeyError, RecursionError) as exc:  # JSON and UTF-8 errors are ValueErrors
            copy = path.with_name(f"{path.name}.bad")
            try:
                os.replace(path, copy)
                kept = f"kept as {printable(str(copy))}"
            except OSError:
                kept = "could not keep a copy"
            _log.info("%s: invalid state (%s); %s; starting afresh: dumps present will be exported",
                      printable(str(path)), one_line(exc, 120), kept)
            return
        # An incident whose analysis failed is retried by a restarted watcher (a newer fr-otel may read it).
        retry = ("exporting", "error")
        self.incidents = incidents
        self._done = set().union(*(i.signatures for i in incidents if i.status not in retry))

    def _save_state(self) -> None:
        self.incidents = self.incidents[-_MAX_REMEMBERED:]
        path = self.settings.state_file
        doc = {"version": _STATE_VERSION, "incidents": [asdict(i) for i in self.incidents]}
        try:
            atomic_write(path, (json.dumps(doc, indent=1) + "\n").encode("utf-8", "backslashreplace"))
        except OSError as exc:
            self._say_once(f"{printable(str(path))}: cannot write state ({exc.strerror or one_line(exc)}); a "
                           "restarted watcher would export these incidents again")

    def _say_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            _log.info("%s", message)


def _config_world(dump: RankDump) -> frozenset[int] | None:
    """The default group's ranks in one dump's pg_config (what build_job trusts), None if absent.

    Read per dump, not through build_job, so a thousand ranks arriving one by one cost a thousand
    small looks, not a thousand job models.
    """
    configs = dump.pg_config.values()
    for cfg in configs:
        if cfg.desc == DEFAULT_PG_DESC and cfg.ranks:
            return frozenset(cfg.ranks)
    for cfg in configs:
        # gloo (torch 2.13) records the world under an empty name, if at all
        if not cfg.name and cfg.ranks and cfg.ranks == tuple(range(len(cfg.ranks))):
            return frozenset(cfg.ranks)
    return None


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"
