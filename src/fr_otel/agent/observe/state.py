"""What the agent knows at one instant: per-group progress and its own health.

Plain immutable data, shared by the poller (which writes it), the Prometheus collector
(which renders it at scrape time) and the tests (which build it by hand for golden
output). No torch, no prometheus_client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GroupStatus", "GroupWait", "Health", "P2PWait", "ProcessInfo", "Snapshot"]


@dataclass(frozen=True, slots=True)
class P2PWait:
    """This rank's oldest pending send or recv to one peer in one group (from a full read)."""

    op: str  # "send" or "recv"
    peer: int | None  # the peer's global rank; None for an any-source recv
    since_ns: int  # enqueue time (epoch ns)

    def age_s(self, now_ns: int) -> float:
        return max(now_ns - self.since_ns, 0) / 1e9


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """One process group as this rank sees it.

    ``inflight_since_ns`` is the enqueue time (epoch ns) of the oldest collective in flight:
    exact once a full recorder read confirmed it (``exact``), else the poll that first saw
    it (an underestimate of the age by at most one poll interval). ``None``: nothing in
    flight. ``timeout_ms`` and ``op`` are known only when exact.
    """

    name: str
    desc: str
    ranks: tuple[int, ...]
    local_id: int | None
    enqueued: int
    completed: int
    inflight_seq: int | None = None
    inflight_since_ns: int | None = None
    exact: bool = False
    op: str = ""
    timeout_ms: int | None = None
    # The group carries send/recv: its counters are this rank's p2p count, never comparable
    # across ranks (so no seq gauges); what is pending is in ``p2p``.
    has_p2p: bool = False
    p2p: tuple[P2PWait, ...] = ()

    @property
    def stall_key(self) -> tuple[str, int | None]:
        """Which stall the collective in flight here would be: the group and its sequence number (what an
        incident covers; None: nothing in flight)."""
        return self.name, self.inflight_seq

    def age_s(self, now_ns: int) -> float:
        """Seconds the oldest collective has been in flight at ``now_ns`` (0 when none)."""
        if self.inflight_since_ns is None:
            return 0.0
        return max(now_ns - self.inflight_since_ns, 0) / 1e9


@dataclass(frozen=True, slots=True)
class GroupWait:
    """How long this rank has waited in one group's collectives (sampled: :mod:`fr_otel.agent.observe.wait_sampler`).

    ``wait_s`` and ``completed`` count since the agent started (the counters Prometheus rates);
    ``recent_share`` is the share of the last window (``recent_s`` long) spent waiting,
    ``recent_wait_s`` the wait per collective completed in it (None when none completed: a hang
    is not slowness).
    """

    name: str
    desc: str
    wait_s: float
    completed: int
    recent_share: float
    recent_wait_s: float | None
    recent_completed: int
    recent_s: float  # how much time the window covers (short just after start)


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """Who this process is (``fr_info``'s labels); strings, as labels are."""

    rank: str = ""
    local_rank: str = ""
    host: str = ""
    torch_version: str = ""
    backend: str = ""
    world_size: str = ""
    recorder_capacity: str = ""


@dataclass(frozen=True, slots=True)
class Health:
    """The agent's own counters (monotonic, since start)."""

    polls: int = 0
    errors: int = 0
    export_failures: int = 0
    incidents: int = 0
    last_poll_s: float | None = None  # epoch seconds of the last successful poll
    last_incident_trace_id: str | None = None
    last_incident_s: float | None = None
    #: The hosts the last incident this rank concluded says a restart should leave out (with its number).
    exclude_hosts: tuple[str, ...] = ()
    exclude_incident: int | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything ``/metrics`` shows, taken under one lock."""

    info: ProcessInfo
    recorder_enabled: bool
    groups: tuple[GroupStatus, ...] = ()
    health: Health = field(default_factory=Health)
    step: int | None = None  # the training step this rank is in; None while no step was counted
    step_started_ns: int | None = None  # when that step began (epoch ns)
    waits: tuple[GroupWait, ...] = ()  # per group, where this backend's recorder lets waits be measured
    stall_s: float | None = None  # the agent's stall threshold (the rules compare against it); None: not exported
    abort_after_s: float | None = None  # the age at which a hang's stuck ranks exit; None: --on-hang is not abort
