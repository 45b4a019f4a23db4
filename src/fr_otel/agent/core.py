"""The agent: one daemon thread that watches the recorder, serves metrics and runs incidents.

Life of an agent::

    start()  ->  [waits for torch.distributed's default process group]  ->  ready: claims the
                 process (FR_OTEL_AGENT_PID), groups from Python, recorder entry point,
                 /metrics, store channel
    while waiting: a launcher (torchrun) stops its agent quietly; pg_warn_seconds: one warning
    every poll_interval:  progress (~0 ms) -> group states -> full read only if suspect
                          -> stalls past threshold raise an incident -> others' incidents joined
    incident k:  flush worker: dump file + copy to the raiser; the raiser: verdict + trace
    exit / exception / SIGTERM: join or raise, flush (bounded), leave a final copy

Every step runs under :meth:`HealthTracker.guard`: a failure is a counter and a rare log
line, never an exception in the training thread. The training thread only ever runs the
hooks, and those are bounded by ``flush_timeout``.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import suppress
from functools import partial
from typing import Any

from ..common.log import logger
from ..incident.trigger import Trigger
from ..otlp.config import ExportConfig
from ..trace.ids import job_identity
from .links.channel import connect_channel
from .config import FR_OTEL_AGENT_PID, FR_OTEL_PG_WARN_SECONDS, AgentConfig
from .serve.health import HealthTracker
from .guest.hooks import ExitHooks
from .guest.thread_deaths import DEATHS
from .links.host_map import HostMapKeeper
from .incident.rank import IncidentRank, node_dump_folders
from .hang_abort import attempt_number, mark_attempt
from .incident.runner import IncidentRunner
from .logs import set_log_rank
from .links.node_leader import node_role_for, records_folder
from .observe.last_record import RecordKeeper
from .observe.poller import ProgressTracker
from .guest.process_identity import this_process
from .links.reachability import reachable_at
from .observe.recorder import (
    GroupInfo,
    Recorder,
    groups_version,
    process_group_ready,
    read_groups,
    recorder_capacity,
    warn_recorder_off,
)
from .guest.role import in_launcher, rank_variables, rank_words
from .serve.server import MetricsServer, local_rank, port_for, start_metrics_server
from .slow_watch import SlowWatch, incident_for_holdups
from .start_line import start_line
from .observe.state import ProcessInfo, Snapshot
from .guest.step_counter import COUNTER, optimizer_step_hook
from .links.store_link import StoreUnavailable
from .observe.wait_sampler import WaitSampler, enqueue_is_start, group_waits

__all__ = ["Agent"]

log = logger("fr_otel.agent")

_EXIT_STORE_TIMEOUT_S = 2.0
_ARM_POLL_S = 0.05
#: How long after start the poll thread looks for torch.optim that often; later, once per poll
#: (a job that never imports torch.optim must not pay 20 wake-ups a second for its whole life).
_ARM_WINDOW_S = 120.0
#: After a failure of the poll loop itself (outside a step's guard): start it again this much later.
_LOOP_RETRY_S = 1.0


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
        self.waits: WaitSampler | None = None  # None: not ready, off, or a recorder that cannot tell a wait
        self.incidents: IncidentRunner | None = None  # None: incidents off, or not ready yet
        self.slow: SlowWatch | None = None  # needs the store (incidents) and the wait sampler
        self.records: RecordKeeper | None = None  # this rank's last record on its node (incidents on)
        self.info = ProcessInfo()
        self.process = this_process(None)  # where this rank runs (local rank known once ready)
        self.server: MetricsServer | None = None
        self._groups: tuple[GroupInfo, ...] = ()
        self._groups_version: tuple[int, int] | None = None
        self._last_full_read = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hooks: ExitHooks | None = None
        self._exiting = False
        self._exit_deadline: float | None = None  # monotonic; set by the first exit hook
        self._step_hook: Any = None  # torch's handle of the optimizer post-step hook (False: none in this torch)
        self._started = time.monotonic()
        self._pg_warned = False

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def start(self) -> None:
        with self.health.guard("start"):
            if self.config.on_hang == "abort":  # before the process group: an attempt that fails sooner is still one
                mark_attempt(f"start {attempt_number()}")
            self._arm_steps()
            if process_group_ready() is not None:
                self.tick()  # ready now: /metrics is up when start() returns
        self._thread = threading.Thread(target=self._run, name="fr-otel-poller", daemon=True)
        self._thread.start()
        if self.config.hooks:
            with self.health.guard("installing exit hooks"):
                self._hooks = ExitHooks(self.config.hooks, self._on_exit, self._on_exception, self._on_sigterm)
                installed = self._hooks.install()
                if "excepthook" in self.config.hooks:  # a thread's death too: a producer that raised
                    DEATHS.install()
                log.debug("hooks installed: %s", ", ".join(installed) or "none")
        _watch_forks(self)
        log.debug("agent started in pid %d (%s); it serves /metrics once this process has a process group",
                  self.pid, rank_words())

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
                DEATHS.uninstall()
            self._hooks = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self.incidents is not None:
            self.incidents.stop(timeout)
        if self.server is not None and close_server:
            with self.health.guard("stopping /metrics"):
                self.server.stop()
            self.server = None

    def _after_fork_in_child(self) -> None:
        # The child has none of our threads; its hooks only chain (they check the pid).
        if self._hooks is not None:
            self._hooks.after_fork_in_child()

    def snapshot(self) -> Snapshot | None:
        if self.rank is None:
            return None
        statuses = self.tracker.statuses
        return Snapshot(self.info, self.recorder_enabled, statuses, self.health.snapshot(),
                        COUNTER.current, COUNTER.started_ns,
                        group_waits(self.waits, statuses) if self.waits is not None else (),
                        self.config.stall_seconds,
                        self.config.abort_after_s if self.config.on_hang == "abort" else None)

    def all_groups(self) -> tuple[GroupInfo, ...]:
        return self._groups

    # -- the poll -----------------------------------------------------------------------
    def _run(self) -> None:
        """The poll thread. Each step has its own guard; this one holds the loop itself (its waits and schedule):
        what escapes is a counted log line and the loop starts again, never a dead agent and a traceback."""
        while not self._stop.is_set():
            with self.health.guard("the poll loop"):
                self._loop()
                return
            self._stop.wait(_LOOP_RETRY_S)

    def _loop(self) -> None:
        interval = self.config.poll_interval
        next_poll = next_sample = time.monotonic() + interval
        arm_fast_until = time.monotonic() + _ARM_WINDOW_S
        while True:
            # Until the step hook is in, look for torch.optim often (one dict lookup): the
            # first training steps must count. The poll itself keeps its interval, and
            # after the start-up window the poll alone looks (tick arms the hook too).
            # Between polls, the wait sampler reads the progress counters at random gaps.
            wait = min(next_poll, next_sample) - time.monotonic()
            arming = self._step_hook is None and time.monotonic() < arm_fast_until
            if arming:
                wait = min(wait, _ARM_POLL_S)
            if self._stop.wait(max(wait, 0.0)):
                return
            if arming:
                with self.health.guard("registering the step hook"):
                    self._arm_steps()
            if time.monotonic() >= next_sample:
                next_sample = time.monotonic() + self._sample_waits(interval)
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + interval
                with self.health.guard("poll"):
                    self.tick()

    def _sample_waits(self, otherwise_s: float) -> float:
        """One sample for the wait sampler; the gap to the next (``otherwise_s`` without a sampler)."""
        sampler, recorder = self.waits, self.recorder
        if sampler is None or recorder is None:
            return otherwise_s
        with self.health.guard("sampling the progress counters"):
            t0 = time.thread_time()  # CPU, the GIL's share: not the wait for it
            sampler.sample(recorder.counters(), time.monotonic_ns(), self.tracker.completed)
            sampler.cost_s += time.thread_time() - t0
        if sampler.blind:  # said once by the sampler
            self.waits = None
            return otherwise_s
        return sampler.gap_s()

    def _arm_steps(self) -> None:
        if self._step_hook is None:
            self._step_hook = optimizer_step_hook()

    def tick(self) -> None:
        """One poll; the thread calls it every ``poll_interval``."""
        self._arm_steps()
        if self.dist is None:
            dist = process_group_ready()
            if dist is None:
                self._waiting()
                return
            self._on_ready(dist)
        elif not self.dist.is_initialized():
            return  # process group destroyed: the job is ending
        self._refresh_groups()
        if self.recorder is None or not self.recorder.available or not self.recorder_enabled:
            self.health.polled()
            return
        now = time.time_ns()
        counters = self.recorder.counters()
        self.tracker.update({slot: (c.enqueued, c.completed) for slot, c in counters.items()}, now)
        records = self.records
        if records is not None:  # before this poll's heartbeat: a beat never vouches for an older state
            with self.health.guard("keeping this rank's last record on its node"):
                records.keep(self.recorder.version, counters, self._groups, COUNTER.log(), now)
        if self.tracker.needs_refine(now, self.config.refine_after_s) and self._may_read_full():
            pending, done, slots, p2p = self.recorder.in_flight()
            self._last_full_read = time.monotonic()
            self.tracker.apply_refine(pending, done, slots, time.time_ns(), p2p)
        self.health.polled()
        if self.incidents is not None:
            self.incidents.check_abort()
            now = time.time_ns()
            if self.slow is not None and self.waits is not None and self.incidents.reachable():
                with self.health.guard("comparing waits through the store"), suppress(StoreUnavailable):
                    self.slow.poll(self.waits, self.tracker.statuses)
            self.incidents.poll(self.tracker.stalls(now, self.config.stall_seconds), now)

    def _may_read_full(self) -> bool:
        """A full read holds the GIL (~30 ms per 2000 entries): keep it under ~2% of wall time."""
        assert self.recorder is not None
        gap = max(2 * self.config.poll_interval, 50 * self.recorder.full_read_s)
        return time.monotonic() - self._last_full_read >= gap

    def _waiting(self) -> None:
        """No process group yet. A launcher recognised by now (a wrapper that imported torchrun's
        module) stops its agent quietly; any other process says once that it has waited long."""
        if in_launcher():
            self.stop(close_server=False)
            return
        waited = time.monotonic() - self._started
        if self._pg_warned or waited < self.config.pg_warn_seconds or _spawning_parent():
            return
        self._pg_warned = True
        log.warning("no process group yet, %.3g s after the agent started in this process (pid %d, %s): it serves "
                    "no /metrics and raises no incidents until the process calls torch.distributed."
                    "init_process_group. If this process is not a training rank (a launcher or helper that "
                    "inherited a rank's variables), start the agent with fr_otel.start() in the training script "
                    "instead of fr-otel run; if it is a rank that is slow to start, raise %s.",
                    waited, self.pid, rank_words(), FR_OTEL_PG_WARN_SECONDS)

    def _on_ready(self, dist: Any) -> None:
        import torch

        # Only now is this process a rank that owns an agent: its children (data loader workers,
        # subprocesses) inherit the claim and start none. A launcher never gets here, so the
        # workers it starts claim their own.
        os.environ[FR_OTEL_AGENT_PID] = str(self.pid)
        rank, world_size = int(dist.get_rank()), int(dist.get_world_size())
        recorder = Recorder(dist)
        self.dist, self.rank, self.world_size, self.recorder = dist, rank, world_size, recorder
        set_log_rank(rank)
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
        if self.recorder_enabled and self.config.wait_sample_interval is not None:
            self.waits = WaitSampler(self.config.wait_sample_interval,
                                     enqueue_is_start=enqueue_is_start(recorder.backend))
        self._refresh_groups()
        if self.config.metrics_port is not None:
            from .serve.metrics import FrCollector

            port = port_for(self.config.metrics_port, local_rank())
            self.server = start_metrics_server(FrCollector(self.snapshot), port, self.config.metrics_addr or "0.0.0.0")
            if self.server is not None:
                log.debug("serving /metrics at %s", self.server.url)
        if self.config.incidents and self.recorder_enabled:
            with self.health.guard("connecting to the job's store (incidents are off)"):
                channel, job_id = connect_channel(dist, job_identity(self.config.job_id)[0])
                served = (self.server.addr, self.server.port) if self.server is not None else None
                self.process = reachable_at(self.process, channel.address, served)  # peers probe it there
                hosts = HostMapKeeper(channel, rank, world_size, self.process, leader=local_rank() in (0, None),
                                      folders=partial(node_dump_folders, self.config))
                node = node_role_for(self.config, channel, job_id, rank, world_size, self.process, local_rank(),
                                     os.environ)
                records = records_folder(self.config, job_id, rank, world_size, self.process, os.environ, node)
                if records is not None:
                    self.records = RecordKeeper(records, self.process, self.pid)
                me = IncidentRank(self.config, self.export_config, self.health, channel, job_id, rank, world_size,
                                  self.process, partial(recorder.full_bytes, stacks=True), self.all_groups, hosts,
                                  node, records)
                self.incidents = IncidentRunner(me, self.tracker)
                if self.waits is not None:
                    self.slow = SlowWatch(channel, rank, world_size, self.process.host or "", comparer=rank == 0,
                                          stalled_after_s=self.config.refine_after_s, recent_op=recorder.recent_op,
                                          on_holdup=incident_for_holdups(self.incidents), node=node)
                log.debug("incidents through %s, job id %s%s", channel.how, job_id,
                          "" if node is None else f"; {'this node leader' if node.leader else 'its node leader'} "
                          f"in {node.node.folder}")
                if node is not None and node.leader:  # one line per node: the leaders are on, and where
                    log.info("this rank leads its node's agents: one store request per poll for the node, "
                             "node folder %s (FR_OTEL_NODE_LEADERS=off goes back to every rank on its own)",
                             node.node.folder)
        if local_rank() in (0, None):  # one line per host, not one per rank
            with self.health.guard("start-up line"):
                log.info("%s", self.start_line())

    def start_line(self) -> str:
        """One line: what this agent serves where, and where an incident's dumps and trace go."""
        return start_line(self.config, self.export_config, f"rank {self.rank} of {self.world_size}", self.server,
                          self.process.host, incidents=self.incidents is not None)

    def _refresh_groups(self) -> None:
        version = groups_version(self.dist)
        if version != self._groups_version:
            groups, _ = read_groups(self.dist)
            self._groups = groups
            self._groups_version = version
            self.tracker.set_groups(groups)

    # -- incidents: see IncidentRunner ----------------------------------------------------
    def flush(self, reason: str = "manual", timeout: float | None = None) -> bool:
        """Join any open incident, else raise one; wait (bounded) for this rank's part, and the
        verdict if this rank raised it. True when all of it finished; False without incidents."""
        return self.incidents.flush(Trigger.requested(reason), timeout) if self.incidents is not None else False

    # -- hooks (run in the training thread, or the signal watcher): one budget ---------
    def exit_deadline(self) -> float:
        """When the way out ends, whatever happens: ``flush_timeout`` after the first exit hook
        fired. Every step after it (incident, exit copy, stopping threads) shares this budget."""
        if self._exit_deadline is None:
            self._exit_deadline = time.monotonic() + self.config.flush_timeout
        return self._exit_deadline

    def _on_exit(self) -> None:
        if self._exiting:
            return
        self._exiting = True
        deadline = self.exit_deadline()
        if self.records is not None:  # leaving on its own: it speaks for itself (its exit copy)
            with self.health.guard("removing this rank's last record"):
                self.records.drop()
            self.records = None
        if self.incidents is not None:
            self.incidents.at_exit(deadline)
            node = self.incidents.me.node
            if node is not None and node.leader:
                with self.health.guard("removing this node's folder"):
                    node.node.remove()
        self.stop(timeout=min(_EXIT_STORE_TIMEOUT_S, max(deadline - time.monotonic(), 0.0)), close_server=False)
        log.debug("the agent's way out is done, %.1f s of its %g s budget left", deadline - time.monotonic(),
                  self.config.flush_timeout)
        h = self.health.snapshot()
        if h.errors or h.export_failures:
            log.warning("agent stopped: %d polls, %d agent errors, %d incident exports failed (training was not "
                        "affected)", h.polls, h.errors, h.export_failures)

    def _on_exception(self, exc: BaseException) -> None:
        if self.incidents is not None:
            with self.health.guard("the uncaught exception's flush"):
                self.incidents.at_exception(exc, self.exit_deadline())

    def _on_sigterm(self) -> None:
        if self.incidents is not None:
            with self.health.guard("the SIGTERM flush"):
                self.incidents.at_sigterm(self.exit_deadline())


def _spawning_parent() -> bool:
    """A process with no rank variable that has children alive (``torch.multiprocessing.spawn``, Lightning's
    ``ddp_spawn``): they are the ranks, and it may never have a process group of its own. Read from /proc, so
    that nothing here reaps a child its owner waits for."""
    if rank_variables(os.environ):
        return False
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    for task in tasks:
        with suppress(OSError), open(f"/proc/self/task/{task}/children") as f:
            if f.read().strip():
                return True
    return False


_fork_watch: list[Agent] = []  # the latest agent: one at_fork registration per process, ever


def _watch_forks(agent: Agent) -> None:
    if not _fork_watch and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=lambda: _fork_watch[0]._after_fork_in_child())
    _fork_watch[:] = [agent]
