"""Real gloo hangs on CPU, frozen into Flight Recorder dumps.

Synthetic dumps only say what we think torch writes; these come from a real multi-process
gloo job under the installed torch, so parser and verdict tests see the genuine format and
its quirks. Gloo never dumps by itself, so every rank pulls its own recorder in-process
while the job is stuck, and all ranks exit right after (no waiting for the gloo timeout).

The job always runs in a separate Python process, so the caller never imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["SCENARIOS", "main", "make_dumps"]

SCENARIOS: tuple[str, ...] = (
    "skip_allreduce",
    "subgroup_stall",
    "op_mismatch",
    "shape_mismatch",
    "straggler",
    "healthy",
)

# Long enough that a rank surely sits inside its blocking call on a loaded 2-core CI box,
# short enough to keep a job well under 20 s; the gloo timeout stays far beyond it so no
# collective times out before the dump.
_DUMP_DELAY_S = 2.0
_GLOO_TIMEOUT_S = 30.0
_BARRIER_TIMEOUT_S = 20.0
_STRAGGLER_DELAY_S = 0.25
_SETTLE_TIMEOUT_S = 5.0
_FALLBACK_DUMP_S = 8.0
_STALL_S = 3600.0  # "forever": a stalled rank is ended by its own dump thread


# --------------------------------------------------------------------------- caller side


def make_dumps(
    scenario: str,
    out_dir: str | os.PathLike[str],
    *,
    world_size: int = 4,
    buffer_size: int = 2000,
    timeout_s: float = 60.0,
) -> Path:
    """Run ``scenario`` as a real gloo job and write one dump per rank under ``out_dir``.

    Writes ``pickle/rank_<r>``, ``json/rank_<r>.json`` and ``scenario.json``; returns the
    directory. Runs in a child interpreter (torch stays out of this process) and raises
    ``RuntimeError`` with the child's stderr tail if it fails or outlives ``timeout_s``.
    """
    _check_args(scenario, world_size, buffer_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    src_root = str(Path(__file__).resolve().parents[2])  # so `-m` works without install
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src_root, env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable, "-m", "fr_otel.testing.gloo_jobs",
        "--scenario", scenario, "--out", str(out),
        "--world-size", str(world_size), "--buffer-size", str(buffer_size),
        "--timeout", str(timeout_s),
    ]
    # Own session: on timeout the whole tree (coordinator + spawned ranks) is killed at once.
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=hasattr(os, "killpg"),
    )
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        _, err = proc.communicate()
        raise RuntimeError(
            f"gloo job {scenario!r} exceeded {timeout_s:.0f} s; stderr tail:\n{_tail(err)}"
        ) from None
    if proc.returncode != 0:
        raise RuntimeError(
            f"gloo job {scenario!r} failed (exit {proc.returncode}); stderr tail:\n{_tail(err)}"
        )
    missing = [str(p) for p in _expected_files(out, world_size) if not p.is_file()]
    if missing:
        raise RuntimeError(f"gloo job {scenario!r} left no {missing}; stderr tail:\n{_tail(err)}")
    return out


def _check_args(scenario: str, world_size: int, buffer_size: int) -> None:
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
    need = 4 if scenario == "subgroup_stall" else 2
    if world_size < need:
        raise ValueError(f"{scenario} needs world_size >= {need}, got {world_size}")
    if buffer_size < 1:
        raise ValueError(f"buffer_size must be >= 1 (0 disables the recorder), got {buffer_size}")


def _expected_files(out: Path, world_size: int) -> list[Path]:
    files = [out / "scenario.json"]
    for r in range(world_size):
        files += [out / "pickle" / f"rank_{r}", out / "json" / f"rank_{r}.json"]
    return files


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass


def _tail(data: bytes | None, limit: int = 4000) -> str:
    text = (data or b"").decode("utf-8", "replace")
    return text[-limit:] if text.strip() else "(empty)"


# --------------------------------------------------------------------------- scenario plans


def _plan(scenario: str, world_size: int) -> dict[str, Any]:
    """Descriptive metadata: who misbehaves, in which group, at which collective_seq_id."""
    ws = world_size
    if scenario == "skip_allreduce":
        c = min(2, ws - 1)
        return {"misbehaving_rank": c, "group": "world", "step": 6,
                "description": f"5 world all_reduces; rank {c} skips the 6th (sleeps), "
                               "the others block in it"}
    if scenario == "subgroup_stall":
        a, b = list(range(ws // 2)), list(range(ws // 2, ws))
        return {"misbehaving_rank": b[-1], "group": "B", "step": 4,
                "subgroups": {"A": a, "B": b},
                "description": f"3 world + 3 own-subgroup all_reduces; rank {b[-1]} stalls "
                               f"before its 4th all_reduce on B={b}; B's other ranks block in "
                               f"it; A={a} completes its 4th all_reduce, then blocks in the "
                               "4th world all_reduce"}
    if scenario == "op_mismatch":
        c = min(1, ws - 1)
        return {"misbehaving_rank": c, "group": "world", "step": 4,
                "description": f"3 world all_reduces; at the 4th, rank {c} calls broadcast "
                               "(src 0) where the others call all_reduce"}
    if scenario == "shape_mismatch":
        c = min(3, ws - 1)
        return {"misbehaving_rank": c, "group": "world", "step": 4,
                "description": f"3 world all_reduces of (4, 4); at the 4th rank {c} passes "
                               "(2, 8) (same numel) where the others pass (4, 4)"}
    if scenario == "straggler":
        c = min(1, ws - 1)
        return {"misbehaving_rank": c, "group": "world", "step": None,
                "description": f"12 world all_reduces; rank {c} sleeps "
                               f"{_STRAGGLER_DELAY_S} s before each; no hang"}
    return {"misbehaving_rank": None, "group": "world", "step": None,
            "description": "12 world all_reduces, all completed"}


# --------------------------------------------------------------------------- coordinator


def main(argv: list[str] | None = None) -> int:
    """CLI: run one scenario's ranks as child processes and collect their dumps."""
    ap = argparse.ArgumentParser(prog="python -m fr_otel.testing.gloo_jobs", description=__doc__)
    ap.add_argument("--scenario", required=True, choices=SCENARIOS)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--buffer-size", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before ranks are killed")
    args = ap.parse_args(argv)
    try:
        _check_args(args.scenario, args.world_size, args.buffer_size)
    except ValueError as e:
        ap.error(str(e))
    return _coordinate(args.scenario, args.out, args.world_size, args.buffer_size, args.timeout)


def _coordinate(scenario: str, out: Path, ws: int, buffer_size: int, timeout_s: float) -> int:
    """Run the ranks; the coordinator itself never imports torch (stdlib multiprocessing)."""
    t0 = time.monotonic()
    out = out.resolve()
    for sub in ("pickle", "json"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for stale in [out / "scenario.json", *(out / "pickle").glob("rank_*"),
                  *(out / "json").glob("rank_*.json")]:
        stale.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="fr-otel-gloo-") as status_dir:
        return _run_ranks(scenario, out, Path(status_dir), ws, buffer_size, t0 + timeout_s, t0)


def _run_ranks(scenario: str, out: Path, status_dir: Path, ws: int, buffer_size: int,
               deadline: float, t0: float) -> int:
    import multiprocessing as mp
    from multiprocessing.connection import wait

    # Re-imported by its real name so the rank target pickles by name even under `-m`.
    from fr_otel.testing import gloo_jobs as named  # noqa: PLW0406

    # The recorder reads its size when torch initialises: set it before any rank starts.
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(buffer_size)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    lo = _loopback_ifname()
    if lo and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = lo  # loopback only, whatever the hostname resolves to

    # A forkserver imports torch once and forks every rank from that clean, single-threaded
    # process: as safe as spawn, but not one torch import per rank (~3 s on 2 busy cores).
    # torch._inductor too: the first dump with stack traces imports it (~800 modules, 1.5 s).
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch.distributed", "torch._inductor"])
    else:
        ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(ws)
    procs = [
        ctx.Process(target=named._rank_main,
                    args=(r, ws, scenario, str(out), str(status_dir), barrier),
                    name=f"gloo-rank-{r}", daemon=True)
        for r in range(ws)
    ]
    try:
        for p in procs:
            p.start()
        failed = _join_all(procs, wait, deadline=deadline)
    finally:
        _stop_forkserver(ctx)
    if failed:
        print(f"gloo_jobs: {scenario}: {failed}", file=sys.stderr)
        return 1

    reports = [status_dir / f"rank_{r}.json" for r in range(ws)]
    infos = [json.loads(f.read_text()) if f.is_file() else {} for f in reports]
    groups: dict[str, Any] = {}
    for info in infos:
        groups.update(info.get("groups", {}))
    ranks = {str(r): {"outcome": info.get("outcome"), "groups": sorted(info.get("groups", {}))}
             for r, info in enumerate(infos)}
    plan = _plan(scenario, ws)
    meta = {
        "scenario": scenario,
        "world_size": ws,
        "backend": "gloo",
        "buffer_size": buffer_size,
        **plan,
        # gloo's pg_config is empty in torch 2.13: the real names and members, as the ranks saw them
        "group_name": next((n for n, g in groups.items() if g["label"] == plan["group"]), None),
        "groups": groups,
        "ranks": ranks,
        "torch_version": next((i["torch_version"] for i in infos if i), None),
        "wall_s": round(time.monotonic() - t0, 2),
    }
    (out / "scenario.json").write_text(json.dumps(meta, indent=2) + "\n")
    return 0


def _join_all(procs: list[Any], wait: Callable[..., Any], deadline: float) -> str | None:
    """Wait for every rank; on the first failure or the deadline kill the rest."""
    alive = list(procs)
    while alive:
        left = deadline - time.monotonic()
        if left <= 0:
            _terminate(procs)
            return f"ranks {[p.name for p in alive]} still running at the deadline"
        wait([p.sentinel for p in alive], timeout=left)
        for p in list(alive):
            if p.exitcode is None:
                continue
            alive.remove(p)
            if p.exitcode != 0:
                _terminate(procs)
                return f"{p.name} exited with {p.exitcode}"
    return None


def _terminate(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(5)


def _stop_forkserver(ctx: Any) -> None:
    """Kill the forkserver now: its normal shutdown with torch loaded takes seconds under load,
    and the caller's pipes stay open until it is gone."""
    if ctx.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    try:
        if pid:
            os.kill(pid, signal.SIGKILL)
        if server is not None and hasattr(server, "_stop"):
            server._stop()  # reaps it and removes its socket
    except (OSError, ChildProcessError):
        pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _loopback_ifname() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


# --------------------------------------------------------------------------- one rank


class _Rank:
    """One rank's dump machinery: dump exactly once (timer or main thread), then exit."""

    def __init__(self, rank: int, out: Path, status_dir: Path, barrier: Any) -> None:
        self.rank, self.out, self.status_dir, self.barrier = rank, out, status_dir, barrier
        self.outcome = "not reached"
        self.groups: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def arm(self, delay_s: float = _DUMP_DELAY_S) -> None:
        """Dump from a helper thread ``delay_s`` from now: the main thread may never return."""
        threading.Thread(target=self._timer, args=(delay_s,), daemon=True,
                         name="fr-dump").start()

    def _timer(self, delay_s: float) -> None:
        time.sleep(delay_s)
        self.dump_and_exit()

    def dump_and_exit(self, *, settle: bool = False) -> None:
        """Pull this rank's recorder, wait until every rank has too, then leave at once.

        ``settle``: first wait until the recorder retired everything, because gloo's
        ``wait()`` returns before its worker thread retires the entry, so a dump taken right
        after a completed collective can still show it pending. No rank may exit before all
        have dumped: a closed gloo peer would fail the others' pending collectives and
        change what their dumps show.
        """
        self._lock.acquire()  # a second caller blocks here until os._exit ends the process
        code = 1
        try:
            if settle:
                _settle(entries=True)
            pkl, js = _pull_recorder()
            (self.out / "pickle" / f"rank_{self.rank}").write_bytes(pkl)
            (self.out / "json" / f"rank_{self.rank}.json").write_bytes(js)
            import torch

            status = {"outcome": self.outcome, "groups": self.groups,
                      "torch_version": torch.__version__}
            (self.status_dir / f"rank_{self.rank}.json").write_text(json.dumps(status))
            code = 0
            self.barrier.wait(_BARRIER_TIMEOUT_S)
        except threading.BrokenBarrierError:
            pass  # a peer died: our dump is written, the coordinator reports the peer
        except BaseException:  # noqa: BLE001 - any failure: report it and exit, never hang
            traceback.print_exc()  # fail fast: the stuck main thread would never exit
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def _settle(*, entries: bool = False, timeout_s: float = _SETTLE_TIMEOUT_S) -> bool:
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


def _c10d(*names: str) -> Callable[..., Any]:
    """The first of ``names`` this torch has: the dump entry points move between releases."""
    import torch._C._distributed_c10d as c10d

    for name in names:
        fn = getattr(c10d, name, None)
        if fn is not None:
            return fn  # type: ignore[no-any-return]
    raise RuntimeError(f"this torch has none of {names}")


def _pull_recorder() -> tuple[bytes, bytes]:
    """Both dump flavours, exactly as torch returns them."""
    dump = _c10d("_dump_fr_trace", "_dump_nccl_trace")
    dump_json = _c10d("_dump_fr_trace_json", "_dump_nccl_trace_json")
    pkl = dump(includeCollectives=True, includeStackTraces=True, onlyActive=False)
    js = dump_json(includeCollectives=True, onlyActive=False)
    return bytes(pkl), bytes(js)


def _rank_main(rank: int, ws: int, scenario: str, out: str, status_dir: str,
               barrier: Any) -> None:
    """Entry point of one rank (module level so multiprocessing can pickle it by name)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ws,
                            timeout=timedelta(seconds=_GLOO_TIMEOUT_S))
    me = _Rank(rank, Path(out), Path(status_dir), barrier)
    world = dist.group.WORLD
    me.groups[_group_name(world)] = {"desc": _group_desc(world), "ranks": list(range(ws)),
                                     "label": "world"}
    plan = _plan(scenario, ws)
    culprit = plan["misbehaving_rank"]

    def x() -> torch.Tensor:
        return torch.full((4, 4), float(rank + 1))

    def done(call: Callable[[], Any]) -> None:
        """A collective that must complete, settled before the next one is issued."""
        call()
        if not _settle():
            print(f"gloo_jobs: rank {rank}: recorder did not settle", file=sys.stderr)

    def stall(outcome: str) -> None:
        """Misbehave: issue nothing more; the armed timer dumps and exits."""
        me.outcome = outcome
        me.arm()
        time.sleep(_STALL_S)

    def blocked_in(outcome: str, call: Callable[[], Any]) -> None:
        """Arm the dump, enter a collective that may never return, record how it ended."""
        me.outcome = outcome
        me.arm()
        try:
            call()
            me.outcome += "; it completed before the dump"
        except Exception as e:  # noqa: BLE001 - gloo may fail a mismatched op, not hang
            me.outcome += f"; it raised {type(e).__name__}: {_first_line(e)}"
        time.sleep(_STALL_S)

    if scenario in ("healthy", "straggler"):
        for _ in range(12):
            if scenario == "straggler" and rank == culprit:
                time.sleep(_STRAGGLER_DELAY_S)
            done(lambda: dist.all_reduce(x()))
        me.outcome = "completed all collectives"
        me.dump_and_exit(settle=True)

    elif scenario == "skip_allreduce":
        for _ in range(5):
            done(lambda: dist.all_reduce(x()))
        if rank == culprit:
            stall("skipped the 6th world all_reduce (sleeping)")
        blocked_in("blocked in the 6th world all_reduce", lambda: dist.all_reduce(x()))

    elif scenario == "subgroup_stall":
        mine, my_label = None, ""
        for label, members in plan["subgroups"].items():  # all ranks, same order
            pg = dist.new_group(members, group_desc=f"subgroup_{label}")
            if rank in members:
                mine, my_label = pg, label
                me.groups[_group_name(pg)] = {"desc": _group_desc(pg), "ranks": members,
                                              "label": label}
        for _ in range(3):
            done(lambda: dist.all_reduce(x()))
        for _ in range(3):
            done(lambda: dist.all_reduce(x(), group=mine))
        if rank == culprit:
            stall(f"stalled before its 4th all_reduce on {my_label} (sleeping)")
        if my_label == "B":
            blocked_in("blocked in the 4th all_reduce on B",
                       lambda: dist.all_reduce(x(), group=mine))
        done(lambda: dist.all_reduce(x(), group=mine))
        blocked_in("completed the 4th all_reduce on A; blocked in the 4th world all_reduce",
                   lambda: dist.all_reduce(x()))

    elif scenario == "op_mismatch":
        for _ in range(3):
            done(lambda: dist.all_reduce(x()))
        if rank == culprit:
            blocked_in("called broadcast (src 0) as the 4th world collective",
                       lambda: dist.broadcast(x(), src=0))
        blocked_in("called all_reduce as the 4th world collective", lambda: dist.all_reduce(x()))

    elif scenario == "shape_mismatch":
        for _ in range(3):
            done(lambda: dist.all_reduce(x()))
        shape = (2, 8) if rank == culprit else (4, 4)
        me.outcome = f"4th world all_reduce with shape {shape}"
        me.arm(_FALLBACK_DUMP_S)  # only if gloo hangs on it; normally it completes
        try:
            dist.all_reduce(torch.ones(shape))
            me.outcome += "; completed"
        except Exception as e:  # noqa: BLE001 - recorded; the fallback timer dumps
            me.outcome += f"; raised {type(e).__name__}: {_first_line(e)}"
            time.sleep(_STALL_S)
        me.dump_and_exit(settle=True)

    raise AssertionError(f"scenario {scenario!r} fell through without dumping")


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0][:300]


def _group_name(pg: Any) -> str:
    return str(getattr(pg, "group_name", "") or "")


def _group_desc(pg: Any) -> str:
    return str(getattr(pg, "group_desc", "") or "")


if __name__ == "__main__":
    sys.exit(main())
