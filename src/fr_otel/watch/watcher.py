"""The watcher's loop: follow dump files until they settle and parse, then export each incident once.

NCCL dumps every rank on a watchdog timeout to ``<TORCH_FR_DUMP_TEMP_FILE><rank>`` and then
aborts the process. ``DebugInfoWriter::write`` opens that final name with ``std::ofstream``
and writes: no temp file, no rename. So a reader can see a half-written file, and a rank that
dies mid-write leaves a truncated one for good. A file therefore counts as *in* only once its
size and mtime have stood still for a settle time *and* it parses; one that still does not
parse then is reported once and counts as missing until it changes.

An incident is the set of dump files not exported yet. It is exported when every expected rank
is in, or once its first dump is older than the deadline (absent ranks then show as
``missing_dump`` evidence); dumps of ranks it missed that arrive soon after are its
stragglers, not a new incident.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..common.log import logger
from ..common.progress import TerminalProgress
from ..common.ranks import compress_ranks
from ..common.text import one_line, printable
from ..diagnosis.verdict import AnalysisOptions
from ..otlp.config import ExportConfig
from ..read.discovery import rank_from_name
from ..read.dump import RankDump
from ..read.dump_file import read_dump_file
from ..read.entry_rules import is_default_group, unnamed_world
from ..trace.options import TraceOptions
from .incident_export import IncidentExport
from .settings import WatchSettings
from .state import (
    MAX_REMEMBERED,
    Incident,
    Signature,
    incident_key,
    load_state,
    save_state,
)

__all__ = ["DumpWatcher"]

_log = logger("fr_otel.watch")


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
    def signature(self) -> Signature:
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
        self._incident_export = IncidentExport(settings.directory, self.export, self.trace, self.analysis,
                                               out_dir=settings.out_dir, progress=self._progress,
                                               say_once=self._say_once)
        self._done: set[Signature] = set()  # file versions already exported: never again
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
        self._incident_export.run(incident, dumps, problems,
                                  lambda final: self._record(incident, taken, final=final))
        return incident

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
        incidents = load_state(self.settings.state_file)
        # An incident whose analysis failed is retried by a restarted watcher (a newer fr-otel may read it).
        retry = ("exporting", "error")
        self.incidents = incidents
        self._done = set().union(*(i.signatures for i in incidents if i.status not in retry))

    def _save_state(self) -> None:
        self.incidents = self.incidents[-MAX_REMEMBERED:]
        path = self.settings.state_file
        try:
            save_state(path, self.incidents)
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
        if is_default_group(cfg.name, cfg.desc) and cfg.ranks:
            return frozenset(cfg.ranks)
    for cfg in configs:
        if unnamed_world(cfg.name, cfg.ranks) and cfg.ranks:
            return frozenset(cfg.ranks)
    return None


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"
