"""The one module that touches torch: this process's Flight Recorder and process groups.

Entry points are detected, not pinned: ``_dump_fr_trace`` (any backend, torch >= 2.6) or
the NCCL build's ``_dump_nccl_trace``, called with camelCase keywords, then snake_case,
whichever this build accepts. Costs measured on torch 2.13 (2 cores, gloo): progress only
(``includeCollectives=False``) ~0 ms; a full read holds the GIL for the whole copy,
~30 ms at 2000 entries and ~300 ms at 20000, so the agent does it only when something is
stuck. Group membership comes from Python (``_world.pg_map``,
``get_process_group_ranks``), because gloo's ``pg_config`` is empty in torch 2.13.

Nothing here imports torch at module level, and nothing imports it at all: the agent
waits until the application has imported ``torch.distributed`` (importing torch from a
second thread while the main thread imports it is asking for trouble).
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from ...common.gc_pause import gc_paused
from ...common.log import logger
from ...read.dump import op_name
from ...read.entry_rules import completion_rule, p2p_name

if TYPE_CHECKING:
    from ..config import AgentConfig

__all__ = [
    "BUFFER_SIZE_ENV",
    "DEFAULT_CAPACITY",
    "OLD_BUFFER_SIZE_ENV",
    "Counters",
    "GroupInfo",
    "InFlightEntry",
    "P2PInFlightEntry",
    "Recorder",
    "distributed_module",
    "groups_version",
    "prepare_recorder",
    "process_group_ready",
    "read_groups",
    "recorder_capacity",
    "recorder_entries",
    "warn_recorder_off",
]

log = logger("fr_otel.agent")

BUFFER_SIZE_ENV = "TORCH_FR_BUFFER_SIZE"
OLD_BUFFER_SIZE_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
DEFAULT_CAPACITY = 2000  # torch's default when neither variable is set


def distributed_module() -> Any | None:
    """``torch.distributed`` if the application imported it completely, else None."""
    mod = sys.modules.get("torch.distributed")
    if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False):
        return None
    if "torch.distributed.distributed_c10d" not in sys.modules:
        return None
    return mod


def process_group_ready() -> Any | None:
    """``torch.distributed`` once the default process group exists, else None."""
    dist = distributed_module()
    if dist is None:
        return None
    try:
        return dist if dist.is_available() and dist.is_initialized() else None
    except Exception:  # noqa: BLE001 - half-torn-down torch at exit
        return None


def recorder_capacity(environ: dict[str, str] | None = None) -> int:
    """The capacity torch reads: TORCH_FR_BUFFER_SIZE, else the old name, else 2000."""
    env = os.environ if environ is None else environ
    for name in (BUFFER_SIZE_ENV, OLD_BUFFER_SIZE_ENV):
        raw = env.get(name, "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                continue
    return DEFAULT_CAPACITY


def prepare_recorder(config: AgentConfig) -> None:
    """Size the recorder (``recorder_capacity``; on when off, unless ``enable_recorder`` is false)
    while it is still ours to set: before the process group exists, torch has not read the size."""
    current_capacity = recorder_capacity()
    if process_group_ready() is not None:
        if config.recorder_capacity is not None and config.recorder_capacity != current_capacity:
            log.warning("recorder_capacity=%d ignored: the process group exists already, the recorder holds %d "
                        "entries", config.recorder_capacity, current_capacity)
        return  # a recorder that is off is reported when the agent gets ready
    wanted: int | None = config.recorder_capacity
    if wanted is None and current_capacity <= 0:
        if not config.enable_recorder:
            warn_recorder_off(too_late=False)
            return
        wanted = DEFAULT_CAPACITY
        log.warning("the PyTorch Flight Recorder was OFF (TORCH_FR_BUFFER_SIZE=0): fr-otel turned it on with %d "
                    "entries (FR_OTEL_ENABLE_RECORDER=false keeps it off)", wanted)
    if wanted is not None:
        os.environ[BUFFER_SIZE_ENV] = str(wanted)
        if OLD_BUFFER_SIZE_ENV in os.environ:
            os.environ[OLD_BUFFER_SIZE_ENV] = str(wanted)


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


class Counters(NamedTuple):
    """One recorder slot's progress counters (``pg_status``): collective sequence numbers."""

    enqueued: int
    started: int  # -1: not recorded (NCCL without TORCH_NCCL_ENABLE_TIMING, gloo)
    completed: int


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A process group this rank belongs to; ``local_id`` is its recorder slot (``pg_id``)."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    local_id: int | None


@dataclass(frozen=True, slots=True)
class InFlightEntry:
    """The oldest not-completed recorder entry of one group."""

    local_id: int
    pg_name: str
    seq: int
    created_ns: int
    op: str
    timeout_ms: int | None


@dataclass(frozen=True, slots=True)
class P2PInFlightEntry:
    """The oldest not-completed send (or recv) of one group to one peer (group-local ranks)."""

    local_id: int
    pg_name: str
    op: str  # "send" or "recv"
    peer_local: int | None  # None: any-source recv
    created_ns: int


def read_groups(dist: Any) -> tuple[tuple[GroupInfo, ...], int]:
    """This rank's groups in creation order, with the recorder slot each got; and the world size.

    The recorder numbers a process's groups in the order they were created (non-member
    groups get no slot; the rule's home: :func:`fr_otel.read.entry_rules.creation_order`):
    verified on torch 2.13 gloo, and corrected from entries whenever a full read names them
    (:meth:`~.poller.ProgressTracker.apply_refine`).
    """
    c10d = dist.distributed_c10d
    world = c10d._world
    pgs = list(world.pg_map)  # a copy: the main thread may be creating groups right now
    names = dict(world.pg_names)
    out = []
    for slot, pg in enumerate(pgs):
        name = str(names.get(pg) or getattr(pg, "group_name", "") or "")
        try:
            desc = str(getattr(pg, "group_desc", "") or "")
        except Exception:  # noqa: BLE001 - older torch without group_desc
            desc = ""
        try:
            ranks = tuple(sorted(int(r) for r in dist.get_process_group_ranks(pg)))
        except Exception:  # noqa: BLE001
            ranks = ()
        out.append(GroupInfo(name=name, desc=desc, ranks=ranks, local_id=slot))
    return tuple(out), int(dist.get_world_size())


def groups_version(dist: Any) -> tuple[int, int]:
    """Changes whenever a group is created or destroyed (cheap: no iteration)."""
    world = dist.distributed_c10d._world
    return len(world.pg_map), int(getattr(world, "group_count", 0) or 0)


class Recorder:
    """Reads this process's recorder through whichever entry points torch offers."""

    def __init__(self, dist: Any) -> None:
        import torch._C._distributed_c10d as c10d  # already imported by torch.distributed

        backend = ""
        try:
            backend = str(dist.get_backend())
        except Exception:  # noqa: BLE001, S110 - no backend name: the generic recorder
            pass
        fr = getattr(c10d, "_dump_fr_trace", None)
        nccl = getattr(c10d, "_dump_nccl_trace", None)
        # NCCL keeps its own recorder (CUDA events); the generic one holds gloo and others.
        self._dump: Callable[..., Any] | None = nccl if (nccl is not None and "nccl" in backend) or fr is None else fr
        self.entry_point = getattr(self._dump, "__name__", "") if self._dump else ""
        self.backend = backend
        self._style: dict[str, str] | None = None
        self.full_read_s = 0.0  # cost of the last full read, for rate limiting
        self.version = ""  # the dump format's version, as the last counters read said

    @property
    def available(self) -> bool:
        return self._dump is not None

    def _call(self, **kwargs: bool) -> bytes:
        assert self._dump is not None
        styles = [self._style] if self._style else [_CAMEL, _SNAKE]
        error: Exception | None = None
        for style in styles:
            try:
                out = self._dump(**{style[k]: v for k, v in kwargs.items()})
                self._style = style
                return bytes(out)
            except TypeError as exc:  # this build names its keywords differently
                error = exc
        raise RuntimeError(f"{self.entry_point} accepts none of the known keyword spellings: {error}")

    def counters(self) -> dict[int, Counters]:
        """local slot -> its progress counters: the ~10 us read (no entries)."""
        raw = pickle.loads(self._call(includeCollectives=False))  # our own process's bytes
        self.version = str(raw.get("version") or "")
        out: dict[int, Counters] = {}
        for key, st in (raw.get("pg_status") or {}).items():
            out[int(key)] = Counters(int(st["last_enqueued_collective"]), int(st.get("last_started_collective", -1)),
                                     int(st["last_completed_collective"]))
        return out

    def progress(self) -> dict[int, tuple[int, int]]:
        """local slot -> (last enqueued, last completed) collective seq: the ~0 ms read."""
        return {slot: (c.enqueued, c.completed) for slot, c in self.counters().items()}

    def full_bytes(self, *, stacks: bool = True, only_active: bool = False) -> bytes:
        """The whole dump as torch pickles it (the bytes NCCL would write to its dump file)."""
        t0 = time.perf_counter()
        try:
            return self._call(includeCollectives=True, includeStackTraces=stacks, onlyActive=only_active)
        finally:
            self.full_read_s = time.perf_counter() - t0

    def in_flight(self) -> tuple[dict[int, InFlightEntry], dict[int, int], dict[int, str],
                                 dict[int, tuple[P2PInFlightEntry, ...]]]:
        """One full read (no stacks; only in-flight entries where the build supports it).

        Returns the oldest pending entry per slot, the highest seq known completed per slot
        with nothing pending, the slot -> group name pairs the entries reveal, and the
        pending send/recv per slot (:func:`scan_p2p`).
        """
        entries = recorder_entries(self.full_bytes(stacks=False, only_active=True))
        return (*scan_entries(entries), scan_p2p(entries))


    def recent_op(self, pg_name: str, last: int = 32) -> str | None:
        """The op most of this rank's last ``last`` collectives in group ``pg_name`` were (one full
        read, no stacks: for a rare log line); None when the recorder holds none of that group."""
        entries = recorder_entries(self.full_bytes(stacks=False))
        ops = [op_name(str(e.get("profiling_name", ""))) for e in entries
               if not e.get("is_p2p") and (e.get("process_group") or ("",))[0] == pg_name][-last:]
        return max(set(ops), key=ops.count) if ops else None


def recorder_entries(raw: bytes) -> list[dict[str, Any]]:
    """The entries of this process's own recorder bytes, as torch pickled them a moment ago: trusted,
    so plain ``pickle`` (a dump file from a shared disk goes through :mod:`fr_otel.read.safe_pickle`),
    with the collector paused (thousands of small dicts would trigger it mid-read, in the user's process)."""
    with gc_paused():
        return list(pickle.loads(raw).get("entries") or [])


def scan_entries(entries: list[dict[str, Any]]) -> tuple[dict[int, InFlightEntry], dict[int, int], dict[int, str]]:
    """Oldest pending collective per slot, last completed seq per slot, slot names."""
    pending: dict[int, InFlightEntry] = {}
    done: dict[int, int] = {}
    slots: dict[int, str] = {}
    entry_completed = completion_rule(entries)
    for e in entries:
        try:
            if e.get("is_p2p"):
                continue
            slot = int(e["pg_id"])
            name = str(e["process_group"][0])
            seq = int(e["collective_seq_id"])
        except (KeyError, TypeError, ValueError, IndexError):
            continue
        slots[slot] = name
        if entry_completed(e):
            if slot not in pending:
                done[slot] = max(done.get(slot, seq), seq)
        elif slot not in pending or seq < pending[slot].seq:
            prof = str(e.get("profiling_name", ""))
            timeout = e.get("timeout_ms")
            pending[slot] = InFlightEntry(
                local_id=slot, pg_name=name, seq=seq, created_ns=int(e.get("time_created_ns") or 0),
                op=op_name(prof).split(" ", 1)[0] or prof,  # the op word only: "send 1->2" labels by "send"
                timeout_ms=int(timeout) if timeout else None,
            )
    for slot in pending:
        done.pop(slot, None)
    return pending, done, slots


def scan_p2p(entries: list[dict[str, Any]]) -> dict[int, tuple[P2PInFlightEntry, ...]]:
    """Per slot, the oldest pending send/recv to each peer (``nccl:send 1->2``: local ranks).

    Bounded by the peers a rank has in a group (a few), whatever the number of pending ops.
    """
    oldest: dict[tuple[int, str, int | None], P2PInFlightEntry] = {}
    entry_completed = completion_rule(entries)
    for e in entries:
        try:
            if not e.get("is_p2p") or entry_completed(e):
                continue
            p2p = p2p_name(str(e["profiling_name"]))
            if p2p is None:
                continue
            slot = int(e["pg_id"])
            key = (slot, p2p.kind, p2p.peer)
            if key not in oldest:
                oldest[key] = P2PInFlightEntry(slot, str(e["process_group"][0]), p2p.kind, p2p.peer,
                                               int(e.get("time_created_ns") or 0))
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    out: dict[int, list[P2PInFlightEntry]] = {}
    for (slot, _, _), entry in oldest.items():
        out.setdefault(slot, []).append(entry)
    return {slot: tuple(v) for slot, v in out.items()}


_CAMEL = {"includeCollectives": "includeCollectives", "includeStackTraces": "includeStackTraces",
          "onlyActive": "onlyActive"}
_SNAKE = {"includeCollectives": "include_collectives", "includeStackTraces": "include_stack_traces",
          "onlyActive": "only_active"}
