"""The job scripts/gpu-check.sh runs on a machine with a GPU, and its judges of what fr-otel said.

A world-size-1 NCCL job whose all_reduce is enqueued but cannot complete: a long kernel
(``torch.cuda._sleep``) holds the stream first, so the collective waits behind it on the device,
just as it does behind a GPU that stopped finishing work. Run under torchrun (one process)::

    torchrun --standalone --nproc-per-node 1 scripts/gpu_check_job.py --mode live --hold-s 40
    torchrun --standalone --nproc-per-node 1 scripts/gpu_check_job.py --mode watchdog --timeout-s 10

``live``: one all_reduce that completes (the recorder shows progress), then one held on the device
for ``--hold-s``; the process group's timeout (``--timeout-s``) is long, so nothing but the fr-otel
agent (``fr-otel run``) notices the stall; the job then finishes normally.

``watchdog``: the same, with a short timeout: NCCL's watchdog times the all_reduce out and writes its
own Flight Recorder dump (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``) to ``<TORCH_FR_DUMP_TEMP_FILE><rank>``,
then aborts the process. The job leaves (code 0) once that file is written and stops growing; it fails
if the all_reduce completes instead (the watchdog never fired) or nothing is written in time.

``judge-live`` and ``judge-offline`` need no torch and no GPU: they read ``fr-otel analyze --json``'s
output (``--analysis FILE``) and say, in one line, whether it is what the check expects: for the live
incident, the NCCL recorder was read and the culprit is named ``device`` (its ``kind``, or its
``cause.class`` where the analysis gives a cause); for the watchdog's dump, that it was read as NCCL's.

Without CUDA the GPU modes exit 2 with one line that says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

PROG = "gpu_check_job"
DEFAULT_DUMP_PREFIX = "~/.cache/torch/comm_lib_trace_rank_"
#: Cycles of the calibration kernel: long enough to time well, short on any GPU (well under a second).
CALIBRATION_CYCLES = 50_000_000


def _say(text: str) -> None:
    print(f"{PROG}: {text}", flush=True)


def _fail(text: str, code: int = 1) -> int:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)
    return code


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", required=True, choices=("live", "watchdog", "judge-live", "judge-offline"),
                        help="live / watchdog: the GPU job (under torchrun); judge-*: check an analysis (no torch)")
    parser.add_argument("--sleep-cycles", type=int, default=0, metavar="N",
                        help="GPU clock cycles the stream is held for (default: --hold-s worth, measured on this GPU)")
    parser.add_argument("--hold-s", type=float, default=None, metavar="SECONDS",
                        help="how long the stream is held when --sleep-cycles is not given "
                             "(default: 40 for live, 6 x --timeout-s + 30 for watchdog)")
    parser.add_argument("--timeout-s", type=float, default=None, metavar="SECONDS",
                        help="the NCCL process group's timeout (default: 600 for live, 10 for watchdog)")
    parser.add_argument("--analysis", type=Path, metavar="FILE",
                        help="judge-*: the output of `fr-otel analyze --json`")
    args = parser.parse_args(argv)
    if args.mode.startswith("judge-") and args.analysis is None:
        parser.error(f"--mode {args.mode} needs --analysis FILE")
    if args.sleep_cycles < 0:
        parser.error("--sleep-cycles must be >= 0")
    for name in ("hold_s", "timeout_s"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            parser.error(f"--{name.replace('_', '-')} must be a positive number of seconds")
    watchdog = args.mode == "watchdog"
    if args.timeout_s is None:
        args.timeout_s = 10.0 if watchdog else 600.0
    if args.hold_s is None:
        args.hold_s = 6 * args.timeout_s + 30 if watchdog else 40.0
    return args


# --- The judges: no torch --------------------------------------------------------------------------

def _load(path: Path) -> dict[str, Any] | str:
    """The analysis as a dict, or why it cannot be one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"cannot read the analysis {path}: {exc}"
    return data if isinstance(data, dict) else f"the analysis {path} is not one JSON object"


def _cause_class(holder: Any) -> str | None:
    cause = holder.get("cause") if isinstance(holder, dict) else None
    value = cause.get("class") if isinstance(cause, dict) else None
    return value if isinstance(value, str) else None


def _culprits(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in data.get("culprits") or [] if isinstance(c, dict)]


def describe(data: dict[str, Any]) -> str:
    """The verdict, backends and each culprit's rank, kind and cause, in one line."""
    parts = []
    for c in _culprits(data):
        cause = _cause_class(c)
        parts.append(f"rank {c.get('rank')} {c.get('kind')}" + (f" (cause {cause})" if cause else ""))
    top = _cause_class(data)
    return (f"verdict {data.get('verdict')}" + (f" (cause {top})" if top else "")
            + f"; backends {','.join(map(str, data.get('backends') or [])) or 'none'}"
            + f"; ranks loaded {data.get('ranks_loaded')}; culprits: {', '.join(parts) or 'none'}")


def names_device(data: dict[str, Any]) -> bool:
    """A culprit whose kind is ``device`` or whose ``cause.class`` is (a one-rank job may have its cause
    on the verdict itself: no peer to blame, the fault inside the collective)."""
    return any(c.get("kind") == "device" or _cause_class(c) == "device" for c in _culprits(data)) \
        or _cause_class(data) == "device"


def judge(mode: str, path: Path) -> int:
    data = _load(path)
    if isinstance(data, str):
        return _fail(data)
    found = describe(data)
    if "nccl" not in (data.get("backends") or []):
        return _fail(f"the dumps were not read as NCCL's: {found}")
    if not isinstance(data.get("ranks_loaded"), int) or data["ranks_loaded"] < 1:
        return _fail(f"no rank's dump was loaded: {found}")
    if mode == "judge-live" and not names_device(data):
        return _fail(f"no culprit is named device (kind or cause.class): {found}")
    _say(f"ok: {found}")
    return 0


# --- The GPU job ---------------------------------------------------------------------------------

def _import_torch() -> Any:
    """torch, without its import-time warnings (a missing NumPy, say): this job's output is its lines."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        import torch.distributed  # noqa: F401
    return torch


def _cycles_per_second(torch: Any) -> float:
    """The GPU clock as ``torch.cuda._sleep`` counts it, measured with CUDA events (after a warm-up)."""
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(CALIBRATION_CYCLES)
    end.record()
    end.synchronize()
    return CALIBRATION_CYCLES / max(float(start.elapsed_time(end)) / 1000.0, 1e-6)


def _stable_file(path: Path, settle_s: float = 1.0) -> int:
    """The size of ``path`` once it exists, is not empty and has not grown for ``settle_s``; 0 before."""
    try:
        size = path.stat().st_size
        if size == 0 or time.time() - path.stat().st_mtime < settle_s:
            return 0
    except OSError:
        return 0
    return size


def run_job(args: argparse.Namespace) -> int:
    try:
        torch = _import_torch()
    except ImportError as exc:
        return _fail(f"CUDA is not available: torch cannot be imported ({exc})", 2)
    if not torch.cuda.is_available():
        return _fail(f"CUDA is not available (torch {torch.__version__}, built for CUDA {torch.version.cuda}): "
                     "this job needs an NVIDIA GPU and a CUDA build of torch", 2)
    if not hasattr(torch.cuda, "_sleep"):
        return _fail(f"torch {torch.__version__} has no torch.cuda._sleep to hold the stream with", 2)
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=timedelta(seconds=args.timeout_s), device_id=device)
    rank = dist.get_rank()
    nccl = torch.cuda.nccl.version()
    nccl_text = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    _say(f"rank {rank} of {dist.get_world_size()} on {torch.cuda.get_device_name(device)} "
         f"(torch {torch.__version__}, NCCL {nccl_text}), timeout {args.timeout_s:g} s")

    warm = torch.ones(1024, device=device)
    dist.all_reduce(warm)  # collective #1 completes: the recorder shows the job at work before the stall
    torch.cuda.synchronize(device)

    cycles = args.sleep_cycles
    if not cycles:
        rate = _cycles_per_second(torch)
        cycles = int(args.hold_s * rate)
        _say(f"GPU clock {rate / 1e9:.2f} GHz: {cycles} cycles hold the stream for about {args.hold_s:g} s")
    held = torch.ones(1024, device=device)
    torch.cuda._sleep(cycles)  # the kernel the all_reduce waits behind, on the device
    started = time.monotonic()
    work = dist.all_reduce(held, async_op=True)
    if work is None:
        return _fail("all_reduce(async_op=True) returned no work handle")
    _say("all_reduce #2 enqueued behind the held stream: in flight, not completed")
    if args.mode == "watchdog":
        return _wait_for_watchdog(args, work, rank, started)

    deadline = started + args.hold_s * 3 + 60
    while not work.is_completed():
        if time.monotonic() > deadline:
            return _fail(f"all_reduce #2 still in flight after {time.monotonic() - started:.0f} s; giving up")
        time.sleep(0.1)
    torch.cuda.synchronize(device)
    total = float(held[0].item())
    _say(f"all_reduce #2 completed after {time.monotonic() - started:.1f} s (value {total:g})")
    dist.destroy_process_group()
    return 0


def _wait_for_watchdog(args: argparse.Namespace, work: Any, rank: int, started: float) -> int:
    """Wait for NCCL's watchdog to time the all_reduce out and write its dump; leave once it has."""
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") \
        or DEFAULT_DUMP_PREFIX
    dump = Path(os.path.expanduser(f"{prefix}{rank}"))
    _say(f"waiting for the watchdog ({args.timeout_s:g} s timeout) to write {dump}")
    deadline = started + args.hold_s
    said_error = False
    while time.monotonic() < deadline:
        size = _stable_file(dump)
        if size:
            _say(f"the watchdog wrote its dump after {time.monotonic() - started:.1f} s: {dump} ({size} bytes)")
            sys.stdout.flush()
            os._exit(0)  # the communicator is aborted and the kernel still runs: no orderly teardown
        try:
            if work.is_completed():
                return _fail(f"all_reduce #2 completed after {time.monotonic() - started:.1f} s: "
                             "the watchdog never fired (is --hold-s longer than --timeout-s?)", 3)
        except Exception as exc:  # the watchdog set its timeout on the work: keep waiting for the dump
            if not said_error:
                _say(f"the all_reduce failed as expected: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
                said_error = True
        time.sleep(0.2)
    return _fail(f"no watchdog dump at {dump} after {args.hold_s:g} s", 4)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mode.startswith("judge-"):
        return judge(args.mode, args.analysis)
    return run_job(args)


if __name__ == "__main__":
    raise SystemExit(main())
