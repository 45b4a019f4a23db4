"""Run a scenario as a real gloo job on CPU and collect one Flight Recorder dump per rank.

Synthetic dumps only say what we think torch writes; these come from a real multi-process
gloo job under the installed torch, so the demo, parser and verdict tests see the genuine
format and its quirks. The job runs in a child interpreter (``python -m fr_otel.scenarios``),
so the caller never imports torch; its coordinator does not either (the ranks do).
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
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

from ..common.files import atomic_write
from .catalog import SCENARIOS
from .rank import rank_main

__all__ = ["gloo_on_loopback", "main", "make_dumps"]


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
        sys.executable, "-m", "fr_otel.scenarios",
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
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {tuple(SCENARIOS)}")
    need = SCENARIOS[scenario].min_world_size
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


# --------------------------------------------------------------------------- coordinator


def main(argv: list[str] | None = None) -> int:
    """CLI: run one scenario's ranks as child processes and collect their dumps."""
    ap = argparse.ArgumentParser(prog="python -m fr_otel.scenarios", description=__doc__)
    ap.add_argument("--scenario", required=True, choices=tuple(SCENARIOS))
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
    from multiprocessing.context import BaseContext
    from multiprocessing.connection import wait

    # The recorder reads its size when torch initialises: set it before any rank starts.
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(buffer_size)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    gloo_on_loopback(os.environ)

    # A forkserver imports torch once and forks every rank from that clean, single-threaded
    # process: as safe as spawn, but not one torch import per rank (~3 s on 2 busy cores).
    # torch._inductor too: the first dump with stack traces imports it (~800 modules, 1.5 s).
    ctx: BaseContext
    if "forkserver" in mp.get_all_start_methods():
        forkserver = mp.get_context("forkserver")
        forkserver.set_forkserver_preload(["torch.distributed", "torch._inductor"])
        ctx = forkserver
    else:
        ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(ws)
    procs = [
        ctx.Process(target=rank_main,
                    args=(r, ws, SCENARIOS[scenario], str(out), str(status_dir), barrier),
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
        print(f"scenarios: {scenario}: {failed}", file=sys.stderr)
        return 1

    reports = [status_dir / f"rank_{r}.json" for r in range(ws)]
    infos = [json.loads(f.read_text()) if f.is_file() else {} for f in reports]
    groups: dict[str, Any] = {}
    for info in infos:
        groups.update(info.get("groups", {}))
    ranks = {str(r): {"outcome": info.get("outcome"), "groups": sorted(info.get("groups", {}))}
             for r, info in enumerate(infos)}
    plan = SCENARIOS[scenario].plan(ws)
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
    atomic_write(out / "scenario.json", (json.dumps(meta, indent=2) + "\n").encode())
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


def gloo_on_loopback(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Point gloo at the loopback interface in ``env`` (unless it names one), whatever the hostname resolves to.

    A single-host job on loopback never depends on the machine's network set-up; returns ``env``.
    """
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return env
    loopback = next((n for n in ("lo", "lo0") if n in names), None)
    if loopback:
        env.setdefault("GLOO_SOCKET_IFNAME", loopback)
    return env


