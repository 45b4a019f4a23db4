"""One rank of a scenario job: gloo set up, the scenario's moves, its recorder pulled while stuck.

Gloo never dumps by itself, so every rank pulls its own recorder in-process while the job
is stuck (a timer thread: the main thread may never return), waits until every rank has,
and exits at once (no waiting for the gloo timeout). Runs inside the job's rank processes;
torch is imported here only.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from ..common.files import atomic_write

if TYPE_CHECKING:
    import torch

__all__ = ["STALL_S", "Plan", "RankRun", "Scenario", "first_line", "rank_main"]

# Long enough that a rank surely sits inside its blocking call on a loaded 2-core CI box,
# short enough to keep a job well under 20 s; the gloo timeout stays far beyond it so no
# collective times out before the dump.
DUMP_DELAY_S = 2.0
GLOO_TIMEOUT_S = 30.0
BARRIER_TIMEOUT_S = 20.0
SETTLE_TIMEOUT_S = 5.0
STALL_S = 3600.0  # "forever": a stalled rank is ended by its own dump thread


class RankRun:
    """What a scenario's rank body works with: its rank, its tensors, and the ways a rank ends.

    Every way ends in exactly one dump of this rank's recorder, then the process exits.
    """

    def __init__(self, rank: int, world_size: int, out: Path, status_dir: Path, barrier: Any) -> None:
        self.rank, self.world_size = rank, world_size
        self.out, self.status_dir, self.barrier = out, status_dir, barrier
        self.outcome = "not reached"
        self.groups: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def add_group(self, pg: Any, ranks: list[int], label: str) -> None:
        """Note a process group this rank belongs to (gloo's dumps hold no names or members)."""
        self.groups[_group_name(pg)] = {"desc": _group_desc(pg), "ranks": ranks, "label": label}

    def tensor(self) -> torch.Tensor:
        """The (4, 4) tensor every collective of the scenarios reduces: this rank's number + 1."""
        import torch

        return torch.full((4, 4), float(self.rank + 1))

    def done(self, call: Callable[[], Any]) -> None:
        """A collective that must complete, settled before the next one is issued."""
        call()
        if not settle():
            print(f"scenarios: rank {self.rank}: recorder did not settle", file=sys.stderr)

    def stall(self, outcome: str) -> None:
        """Misbehave: issue nothing more; the armed timer dumps and exits."""
        self.outcome = outcome
        self.arm()
        time.sleep(STALL_S)

    def blocked_in(self, outcome: str, call: Callable[[], Any]) -> None:
        """Arm the dump, enter a collective that may never return, record how it ended."""
        self.outcome = outcome
        self.arm()
        try:
            call()
            self.outcome += "; it completed before the dump"
        except Exception as e:  # noqa: BLE001 - gloo may fail a mismatched op, not hang
            self.outcome += f"; it raised {type(e).__name__}: {first_line(e)}"
        time.sleep(STALL_S)

    def arm(self, delay_s: float = DUMP_DELAY_S) -> None:
        """Dump from a helper thread ``delay_s`` from now: the main thread may never return."""
        threading.Thread(target=self._timer, args=(delay_s,), daemon=True, name="fr-dump").start()

    def _timer(self, delay_s: float) -> None:
        time.sleep(delay_s)
        self.dump_and_exit()

    def dump_and_exit(self, *, settle_first: bool = False) -> None:
        """Pull this rank's recorder, wait until every rank has too, then leave at once.

        ``settle_first``: first wait until the recorder retired everything, because gloo's
        ``wait()`` returns before its worker thread retires the entry, so a dump taken right
        after a completed collective can still show it pending. No rank may exit before all
        have dumped: a closed gloo peer would fail the others' pending collectives and
        change what their dumps show.
        """
        self._lock.acquire()  # a second caller blocks here until os._exit ends the process
        code = 1
        try:
            if settle_first:
                settle(entries=True)
            pkl, js = _pull_recorder()
            atomic_write(self.out / "pickle" / f"rank_{self.rank}", pkl)
            atomic_write(self.out / "json" / f"rank_{self.rank}.json", js)
            import torch

            status = {"outcome": self.outcome, "groups": self.groups, "torch_version": torch.__version__}
            atomic_write(self.status_dir / f"rank_{self.rank}.json", json.dumps(status).encode())
            code = 0
            self.barrier.wait(BARRIER_TIMEOUT_S)
        except threading.BrokenBarrierError:
            pass  # a peer died: our dump is written, the coordinator reports the peer
        except BaseException:  # noqa: BLE001 - any failure: report it and exit, never hang
            traceback.print_exc()  # fail fast: the stuck main thread would never exit
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


class _PlanBase(TypedDict):
    misbehaving_rank: int | None
    group: str  # the label ("world", "A", "B") of the group where it shows
    step: int | None  # the collective_seq_id in that group


class Plan(_PlanBase, total=False):
    """What the scenario's dumps must show; ``description`` in words, ``subgroups`` by label."""

    subgroups: dict[str, list[int]]
    description: str


class Scenario:
    """One real-hang scenario of a gloo job (subclasses fill in the name, plan and moves)."""

    name: str = ""
    min_world_size: int = 2

    def plan(self, world_size: int) -> Plan:
        raise NotImplementedError

    def run(self, rank: RankRun, plan: Plan) -> None:
        """This rank's moves; never returns normally (every path ends in the rank's dump)."""
        raise NotImplementedError


def rank_main(rank: int, world_size: int, scenario: Scenario, out: str, status_dir: str, barrier: Any) -> None:
    """Entry point of one rank process (module level, so multiprocessing pickles it by name).

    Rendezvous through a file in ``status_dir`` (a FileStore): no TCP port to pick.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = Path(status_dir) / "store"
    dist.init_process_group("gloo", init_method=store.as_uri(), rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=GLOO_TIMEOUT_S))
    run = RankRun(rank, world_size, Path(out), Path(status_dir), barrier)
    run.add_group(dist.group.WORLD, list(range(world_size)), "world")
    scenario.run(run, scenario.plan(world_size))
    raise AssertionError(f"scenario {scenario.name!r} fell through without dumping")


def settle(*, entries: bool = False, timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
    """Wait until gloo's worker threads finished the bookkeeping of every completed collective.

    ``wait()`` returns as soon as the work's future completes; only then does the worker
    thread write ``last_completed_collective`` and retire the entry. A group has two worker
    threads, so a late write for collective n can land after n+1's and leave
    ``last_completed`` behind for good (seen under CPU load). Settling after each collective
    keeps the dumps showing exactly the situation the scenario describes.
    """
    dump_json = _c10d("_dump_fr_trace_json", "_dump_nccl_trace_json")
    deadline = time.monotonic() + timeout_s
    while True:
        status = json.loads(dump_json(includeCollectives=entries, onlyActive=False))
        if all(int(s["last_completed_collective"]) >= int(s["last_enqueued_collective"])
               for s in status.get("pg_status", {}).values()) and all(
                   e.get("retired") in (True, "true", "True")
                   for e in status.get("entries", [])):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, at most 300 characters."""
    return (str(e).splitlines() or [""])[0][:300]


def _c10d(*names: str) -> Callable[..., Any]:
    """The first of ``names`` this torch has: the dump entry points move between releases."""
    import torch._C._distributed_c10d as c10d

    for name in names:
        fn: Callable[..., Any] | None = getattr(c10d, name, None)
        if fn is not None:
            return fn
    raise RuntimeError(f"this torch has none of {names}")


def _pull_recorder() -> tuple[bytes, bytes]:
    """Both dump flavours, exactly as torch returns them."""
    dump = _c10d("_dump_fr_trace", "_dump_nccl_trace")
    dump_json = _c10d("_dump_fr_trace_json", "_dump_nccl_trace_json")
    pkl = dump(includeCollectives=True, includeStackTraces=True, onlyActive=False)
    js = dump_json(includeCollectives=True, onlyActive=False)
    return bytes(pkl), bytes(js)


def _group_name(pg: Any) -> str:
    return str(getattr(pg, "group_name", "") or "")


def _group_desc(pg: Any) -> str:
    return str(getattr(pg, "group_desc", "") or "")
