"""The agent: one daemon thread that watches the recorder, serves metrics and runs incidents.

Life of an agent::

    start()  ->  [waits for torch.distributed's default process group]  ->  ready:
                 groups from Python, recorder entry point, /metrics, store channel
    every poll_interval:  progress (~0 ms) -> group states -> full read only if suspect
                          -> stalls past threshold raise an incident -> others' incidents joined
    incident k:  flush worker: dump file + copy to the raiser; the raiser: verdict + trace
    exit / exception / SIGTERM: join or raise, flush (bounded), leave a final copy

Every step runs under :meth:`HealthTracker.guard`: a failure is a counter and a rare log
line, never an exception in the training thread. The training thread only ever runs the
hooks, and those are bounded by ``flush_timeout``.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from typing import Any

from ..common.text import PrintableFormatter
from ..otlp.config import ExportConfig
from ..read.rank_process import this_process
from ..read.steps import COUNTER
from ..trace.ids import job_identity
from .config import AgentConfig
from .flush import dump_root, flush_incident, publish_final
from .health import HealthTracker
from .hooks import ExitHooks
from .channel import IncidentChannel, connect_channel
from .poller import ProgressTracker, Stall
from .recorder import (
    GroupInfo,
    Recorder,
    groups_version,
    process_group_ready,
    read_groups,
    recorder_capacity,
)
from .server import MetricsServer, local_rank, port_for, start_metrics_server
from .state import ProcessInfo, Snapshot

__all__ = ["Agent"]

log = logging.getLogger("fr_otel.agent")

_EXIT_STORE_TIMEOUT_S = 2.0
_ARM_POLL_S = 0.05
_SEQUEL_WINDOW_S = 60.0


class Agent:
    """One per process; see :func:`fr_otel.agent.start`."""

    def __init__(self, config: AgentConfig, export_config: ExportConfig) -> None:
        self.config = config
        self.export_config = export_config
        self.health = HealthTracker()
        self.tracker = ProgressTracker()
        self.pid = os.getpid()
        # Known once the default process group exists (see _on_ready).
        self.dist: Any = None
        self.rank: int | None = None
        self.world_size: int | None = None
        self.recorder: Recorder | None = None
        self.recorder_enabled = False
        self.channel: IncidentChannel | None = None
        self.job_id: str | None = None
        self.info = ProcessInfo()
        self.process = this_process(None)  # where this rank runs (local rank known once ready)
        self.server: MetricsServer | None = None
        self._groups: tuple[GroupInfo, ...] = ()
        self._groups_version: tuple[int, int] | None = None
        # Incidents
        self._incident_lock = threading.RLock()
        self._known_incident = 0  # highest incident number handled
        self._covered: set[tuple[str, int]] = set()  # (group, seq) some incident already covers
        self._cap_warned = False
        self._last_full_read = 0.0
        self._last_incident = float("-inf")  # monotonic time this rank last took part in one
        # Threads
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._jobs: queue.Queue[tuple[int, dict[str, Any], bool, float, threading.Event] | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._pending = 0
        self._idle = threading.Condition()
        self._hooks: ExitHooks | None = None
        self._exiting = False
        self._step_hook: Any = None  # torch's handle of the optimizer post-step hook (False: none in this torch)

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def start(self) -> None:
        with self.health.guard("start"):
            self._arm_steps()
            if process_group_ready() is not None:
                self.tick()  # ready now: /metrics is up when start() returns
        self._thread = threading.Thread(target=self._run, name="fr-otel-poller", daemon=True)
        self._thread.start()
        if self.config.hooks:
            with self.health.guard("installing exit hooks"):
                self._hooks = ExitHooks(self.config.hooks, self._on_exit, self._on_exception, self._on_sigterm)
                installed = self._hooks.install()
                log.debug("hooks installed: %s", ", ".join(installed) or "none")
        _watch_forks(self)

    def stop(self, timeout: float = 5.0, *, close_server: bool = True) -> None:
        """Stop polling and serving, remove the hooks; no flush (see :meth:`flush`).

        ``close_server=False`` (at exit) leaves the daemon server thread to die with the
        process instead of waiting up to half a second for it.
        """
        self._stop.set()
        if self._step_hook:
            with self.health.guard("removing the step hook"):
                self._step_hook.remove()
            self._step_hook = None
        if self._hooks is not None:
            with self.health.guard("removing exit hooks"):
                self._hooks.uninstall()
            self._hooks = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._worker is not None:
            self._jobs.put(None)
            if self._worker is not threading.current_thread():
                self._worker.join(timeout)
            self._worker = None
        if self.server is not None and close_server:
            with self.health.guard("stopping /metrics"):
                self.server.stop()
            self.server = None

    def _after_fork_in_child(self) -> None:
        # The child has none of our threads; its hooks only chain (they check the pid).
        if self._hooks is not None:
            self._hooks.after_fork_in_child()

    @property
    def metrics_url(self) -> str | None:
        return self.server.url if self.server is not None else None

    def snapshot(self) -> Snapshot | None:
        if self.rank is None:
            return None
        return Snapshot(self.info, self.recorder_enabled, self.tracker.statuses, self.health.snapshot(),
                        COUNTER.step if COUNTER.source else None, COUNTER.started_ns)

    def all_groups(self) -> tuple[GroupInfo, ...]:
        return self._groups

    # -- the poll -----------------------------------------------------------------------
    def _run(self) -> None:
        interval = self.config.poll_interval
        next_poll = time.monotonic() + interval
        while True:
            # Until the step hook is in, look for torch.optim often (one dict lookup): the
            # first training steps must count. The poll itself keeps its interval.
            wait = next_poll - time.monotonic()
            if self._step_hook is None:
                wait = min(wait, _ARM_POLL_S)
            if self._stop.wait(max(wait, 0.0)):
                return
            if self._step_hook is None:
                with self.health.guard("registering the step hook"):
                    self._arm_steps()
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + interval
                with self.health.guard("poll"):
                    self.tick()

    def _arm_steps(self) -> None:
        """Count training steps with no code change: PyTorch's global optimizer post-step hook,
        registered as soon as the application has imported ``torch.optim`` (never imported here)."""
        if self._step_hook is not None:
            return
        mod = sys.modules.get("torch.optim.optimizer")
        if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False):
            return
        register = getattr(mod, "register_optimizer_step_post_hook", None)
        if register is None:
            self._step_hook = False  # this torch has no global hook: fr_otel.step(n) still works
            return
        COUNTER.arm()
        self._step_hook = register(COUNTER.optimizer_stepped)

    def tick(self) -> None:
        """One poll; the thread calls it every ``poll_interval``."""
        self._arm_steps()
        if self.dist is None:
            dist = process_group_ready()
            if dist is None:
                return
            self._on_ready(dist)
        elif not self.dist.is_initialized():
            return  # process group destroyed: the job is ending
        self._refresh_groups()
        if self.recorder is None or not self.recorder.available or not self.recorder_enabled:
            self.health.polled()
            return
        now = time.time_ns()
        self.tracker.update(self.recorder.progress(), now)
        if self.tracker.needs_refine(now, self.config.refine_after_s) and self._may_read_full():
            pending, done, slots, p2p = self.recorder.in_flight()
            self._last_full_read = time.monotonic()
            self.tracker.apply_refine(pending, done, slots, time.time_ns(), p2p)
        self.health.polled()
        if self.channel is not None and self.channel.reachable():
            self._join_open_incidents()
            stalls = self.tracker.stalls(time.time_ns(), self.config.stall_seconds)
            if stalls:
                self._raise_for(stalls)

    def _may_read_full(self) -> bool:
        """A full read holds the GIL (~30 ms per 2000 entries): keep it under ~2% of wall time."""
        assert self.recorder is not None
        gap = max(2 * self.config.poll_interval, 50 * self.recorder.full_read_s)
        return time.monotonic() - self._last_full_read >= gap

    def _on_ready(self, dist: Any) -> None:
        import torch

        rank, world_size = int(dist.get_rank()), int(dist.get_world_size())
        recorder = Recorder(dist)
        self.dist, self.rank, self.world_size, self.recorder = dist, rank, world_size, recorder
        _RankFilter.rank = str(self.rank)
        capacity = recorder_capacity()
        self.recorder_enabled = capacity > 0 and self.recorder.available
        if not recorder.available:
            log.warning("this torch has no Flight Recorder dump entry point; fr-otel can serve no progress "
                        "metrics and raise no incidents")
        elif capacity <= 0:
            warn_recorder_off(too_late=True)
        self.process = this_process(local_rank())
        self.info = ProcessInfo(
            rank=str(self.rank),
            local_rank=str(local_rank() if local_rank() is not None else ""),
            host=self.process.host or "",
            torch_version=str(torch.__version__),
            backend=self.recorder.backend,
            world_size=str(self.world_size),
            recorder_capacity=str(max(capacity, 0)),
        )
        self._refresh_groups()
        if self.config.metrics_port is not None:
            from .metrics import FrCollector

            port = port_for(self.config.metrics_port, local_rank())
            self.server = start_metrics_server(FrCollector(self.snapshot), port, self.config.metrics_addr or "0.0.0.0")
            if self.server is not None:
                log.debug("serving /metrics at %s", self.server.url)
        if self.config.incidents and self.recorder_enabled:
            with self.health.guard("connecting to the job's store (incidents are off)"):
                self.channel, self.job_id = connect_channel(dist, job_identity(self.config.job_id)[0])
                log.debug("incidents through %s, job id %s", self.channel.how, self.job_id)
        if local_rank() in (0, None):  # one line per host, not one per rank
            with self.health.guard("start-up line"):
                log.info("%s", self.start_line())

    def start_line(self) -> str:
        """One line: what this agent serves where, and where an incident's dumps and trace go."""
        local = local_rank()
        if self.config.metrics_port is None:
            metrics = "/metrics off"
        elif self.server is None:
            metrics = "/metrics NOT served (see above)"
        else:
            metrics = _served_at(self.server, self.process.host)
            if self.config.metrics_port and local is not None:
                metrics += f"; this host's ranks on port {self.config.metrics_port} + LOCAL_RANK"
        if self.channel is None:
            return f"agent on (rank {self.rank} of {self.world_size}): {metrics}; incidents off"
        if self.export_config.disabled:
            trace = "no trace (OTEL_SDK_DISABLED)"
        elif self.export_config.endpoint is None:
            from ..incident.delivery import out_dir

            trace = f"trace as OTLP JSON in {os.path.abspath(out_dir(self.config.out_dir))}/ (no OTLP endpoint set)"
        else:
            trace = f"trace to {self.export_config.endpoint} ({self.export_config.protocol})"
        return (f"agent on (rank {self.rank} of {self.world_size}): {metrics}; a collective in flight over "
                f"{self.config.stall_seconds:g} s (or half its timeout) raises an incident: dumps in "
                f"{os.path.abspath(dump_root(self.config))}/, {trace}")

    def _refresh_groups(self) -> None:
        version = groups_version(self.dist)
        if version != self._groups_version:
            groups, _ = read_groups(self.dist)
            self._groups = groups
            self._groups_version = version
            self.tracker.set_groups(groups)

    # -- incidents ----------------------------------------------------------------------
    def _join_open_incidents(self) -> list[threading.Event]:
        """Take part in every incident raised since the last look (one store round trip)."""
        done: list[threading.Event] = []
        assert self.channel is not None
        with self._incident_lock:
            while True:
                k = self._known_incident + 1
                meta = self.channel.owner(k)
                if meta is None:
                    return done
                done.append(self._take_part(k, meta, owner=meta.get("rank") == self.rank))

    def _raise_for(self, stalls: list[Stall]) -> None:
        fresh = [s for s in stalls if (s.group.name, s.group.inflight_seq) not in self._covered]
        if not fresh:
            return
        s = max(fresh, key=lambda s: s.age_s)
        g = s.group
        self.raise_incident("stall", {"pg_name": g.name, "pg_desc": g.desc, "seq": g.inflight_seq, "op": g.op,
                                      "age_s": round(s.age_s, 3), "threshold_s": round(s.threshold_s, 3)})

    def raise_incident(self, reason: str, detail: dict[str, Any] | None = None,
                       deadline: float | None = None) -> threading.Event | None:
        """Raise the next incident (or join the one someone raised first); None when capped."""
        if self.channel is None:
            return None
        with self._incident_lock:
            self._join_open_incidents()
            k = self._known_incident + 1
            if k > self.config.max_incidents:
                if not self._cap_warned:
                    self._cap_warned = True
                    log.warning("this job reached FR_OTEL_MAX_INCIDENTS=%d: no more incidents are raised",
                                self.config.max_incidents)
                return None
            meta = {"rank": self.rank, "reason": reason, "time_ns": time.time_ns(), **(detail or {})}
            won, owner_meta = self.channel.claim(k, meta)
            if won:
                log.warning("rank %s raises incident %d: %s", self.rank, k, _describe(meta))
            return self._take_part(k, owner_meta, owner=won, deadline=deadline)

    def _take_part(self, k: int, meta: dict[str, Any], owner: bool, deadline: float | None = None) -> threading.Event:
        self._known_incident = max(self._known_incident, k)
        self._last_incident = time.monotonic()
        for g in self.tracker.statuses:  # what is stuck now is this incident's business
            if g.inflight_seq is not None:
                self._covered.add((g.name, g.inflight_seq))
        if deadline is None:
            deadline = time.monotonic() + self.config.gather_seconds + self.export_config.timeout_s + 5
        done = threading.Event()
        with self._idle:
            self._pending += 1
        self._jobs.put((k, meta, owner, deadline, done))
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="fr-otel-flush", daemon=True)
            self._worker.start()
        return done

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            k, meta, owner, deadline, done = job
            try:
                with self.health.guard(f"incident {k}"):
                    flush_incident(self, k, meta, owner, deadline)
            finally:
                done.set()
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no incident work is pending; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def flush(self, reason: str = "manual", timeout: float | None = None, *, raise_new: bool = True) -> bool:
        """Join any open incident, else raise one (``raise_new``); wait (bounded) for this
        rank's part, and the verdict if this rank raised it. True when all of it finished."""
        timeout = self.config.flush_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self.health.guard(f"flush ({reason})"):
            if self.channel is None:
                return False
            with self._incident_lock:
                before = self._known_incident
                self._join_open_incidents()
                if raise_new and self._known_incident == before:
                    self.raise_incident(reason, deadline=deadline)
            return self.wait_idle(max(deadline - time.monotonic(), 0))
        return False

    # -- hooks (run in the training thread, or the signal watcher): bounded -------------
    def _on_exit(self) -> None:
        if self._exiting:
            return
        self._exiting = True
        with self.health.guard("flush at exit", level=logging.DEBUG):
            self.wait_idle(self.config.flush_timeout)
            if self.channel is not None and self.recorder_enabled:
                publish_final(self)
        self.stop(timeout=_EXIT_STORE_TIMEOUT_S, close_server=False)
        h = self.health.snapshot()
        if h.errors or h.export_failures:
            log.warning("agent stopped: %d polls, %d agent errors, %d incident exports failed (training was not "
                        "affected)", h.polls, h.errors, h.export_failures)

    def _recent_incident(self) -> bool:
        """Took part in an incident within the last minute: a crash now is most likely its sequel
        (a peer that went away makes gloo raise here), so it joins rather than raises."""
        return time.monotonic() - self._last_incident < _SEQUEL_WINDOW_S

    def _on_exception(self, exc: BaseException) -> None:
        reason = f"uncaught {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        self.flush(reason, raise_new=not self._recent_incident())

    def _on_sigterm(self) -> None:
        stuck = any(g.inflight_seq is not None and (g.name, g.inflight_seq) not in self._covered
                    for g in self.tracker.statuses)
        self.flush("SIGTERM while a collective was in flight" if stuck else "SIGTERM",
                   raise_new=stuck and not self._recent_incident())
        with self.health.guard("flush at SIGTERM", level=logging.DEBUG):
            if self.channel is not None and self.recorder_enabled:
                publish_final(self)


_fork_watch: list[Agent] = []  # the latest agent: one at_fork registration per process, ever


def _watch_forks(agent: Agent) -> None:
    if not _fork_watch and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=lambda: _fork_watch[0]._after_fork_in_child())
    _fork_watch[:] = [agent]


def _describe(meta: dict[str, Any]) -> str:
    if "pg_name" in meta:
        return (f"{meta.get('op') or 'collective'} #{meta.get('seq')} on group {meta.get('pg_name')} "
                f"({meta.get('pg_desc', '')}) in flight {meta.get('age_s')} s (threshold {meta.get('threshold_s')} s)")
    return str(meta.get("reason", ""))


_recorder_warned = False


def warn_recorder_off(*, too_late: bool) -> None:
    """Say once, clearly, that the recorder is off and what to do."""
    global _recorder_warned
    if _recorder_warned:
        return
    _recorder_warned = True
    how = ("fr-otel started after the process group existed, too late to turn it on: set TORCH_FR_BUFFER_SIZE=2000 "
           "in the job's environment, or call fr_otel.start() before init_process_group"
           if too_late else "FR_OTEL_ENABLE_RECORDER=false keeps it off")
    log.warning("the PyTorch Flight Recorder is OFF (TORCH_FR_BUFFER_SIZE / TORCH_NCCL_TRACE_BUFFER_SIZE = 0): no "
                "per-collective progress, in-flight ages or incident traces. %s.", how)


class _RankFilter(logging.Filter):
    """Prefixes the agent's log lines with the rank once it is known."""

    rank = os.environ.get("RANK", "?")

    def filter(self, record: logging.LogRecord) -> bool:
        record.fr_rank = _RankFilter.rank
        return True


def configure_logging(level: str) -> None:
    """The agent logs to stderr itself (a library's NullHandler would swallow its warnings)."""
    logger = logging.getLogger("fr_otel.agent")
    logger.setLevel(level.upper())
    if not any(getattr(h, "_fr_otel", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(PrintableFormatter("fr-otel[rank %(fr_rank)s]: %(message)s"))
        handler.addFilter(_RankFilter())
        handler._fr_otel = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False


def _served_at(server: MetricsServer, host: str | None) -> str:
    """Where ``/metrics`` really listens: every interface (with this host's name, the address a
    Prometheus elsewhere scrapes) or the one address it was bound to."""
    if server.addr in ("", "0.0.0.0", "::"):
        where = f"http://{host}:{server.port}/metrics" if host else f"port {server.port}"
        return f"/metrics on all interfaces ({server.addr or '0.0.0.0'}:{server.port}): {where}"
    return f"/metrics at {server.url}"
