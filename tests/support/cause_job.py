"""A small gloo loop under torchrun whose rank ``CAUSE_RANK`` stops at step ``CAUSE_STEP`` for one known reason.

The causes a culprit can have (:mod:`fr_otel.diagnosis.cause`), each made real on a CPU, so a test can check
that the verdict names the rank *and* why. The agent starts after the process group (``fr_otel.start()``).

=================  ===========================================================================================
``CAUSE_KIND``     what rank ``CAUSE_RANK`` does before its all_reduce at step ``CAUSE_STEP``:
``python_busy``    a Python loop on the CPU, forever
``data_wait``      ``next()`` on a DataLoader whose one worker never returns its batch
``deadlock``       takes lock A then B while a thread of its own takes B then A
``io_wait``        opens a FIFO that no one writes, for reading
``gil_regex``      a catastrophic regular expression (the ``re`` engine never releases the GIL)
``gil_pydll``      ``ctypes.PyDLL`` ``sleep(3600)`` (a foreign call made with the GIL held)
``stopped``        SIGSTOP to itself
``oom``            allocates until its memory cgroup's OOM killer kills it
``exit``           leaves the loop and exits normally (its peers wait in the next all_reduce)
``exception``      raises an uncaught RuntimeError
``sleeping``       waits on a ``threading.Event`` that nothing will set
``native_busy``    multiplies large matrices in torch, forever (the GIL released, the CPU busy)
``thread_wait``    ``queue.get()`` from a producer thread that died of an exception before it put anything
``child_wait``     ``subprocess.run`` of a ``sleep`` that outlasts the test
``divergence``     calls ``barrier`` where its peers call ``all_reduce`` (a rank whose data ran out)
``memory_pressure`` moves itself into the memory cgroup ``CAUSE_CGROUP`` and reads a file four times its limit
                   through ``mmap``, over and over (its page cache thrashes at the limit)
``busy_then_stop`` rank ``CAUSE_RANK`` spins (as ``python_busy``); rank ``CAUSE_RANK2`` sends itself SIGSTOP a
                   second later, while it waits in its all_reduce
``raise_all``      every rank raises an uncaught RuntimeError at step ``CAUSE_STEP``
(empty)            nothing: a healthy run of ``CAUSE_STEPS`` steps
=================  ===========================================================================================

``CAUSE_MARKERS`` (default ``TRAIN_LOOP_MARKERS``): ``pid_rank_<r>`` at start, ``cause_rank_<r>`` just before
the fault, ``done_rank_<r>`` at the end.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

__all__ = ["main"]


def _env(name: str, default: str) -> str:
    return os.environ.get(f"CAUSE_{name}", default)


def _mark(folder: Path | None, name: str, text: str) -> None:
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, folder / name)


class _NeverReturns:
    """A dataset whose items from ``stall_at`` on never come (its worker sleeps)."""

    def __init__(self, stall_at: int) -> None:
        self.stall_at = stall_at

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> int:
        if i >= self.stall_at:
            time.sleep(3600)
        return i


def _fault(cause: str, folder: Path) -> None:
    """Stop this rank for ``cause``; returns only for ``exit`` (the caller leaves the loop)."""
    if cause == "python_busy":
        n = 0
        while True:
            n = (n * 31 + 7) % 1_000_003
    elif cause == "data_wait":
        import torch.utils.data

        loader = torch.utils.data.DataLoader(_NeverReturns(0), batch_size=1, num_workers=1)
        next(iter(loader))
    elif cause == "deadlock":
        a, b = threading.Lock(), threading.Lock()

        def other() -> None:
            with b:
                time.sleep(0.5)
                with a:
                    pass
        threading.Thread(target=other, name="loader-thread", daemon=True).start()
        with a:
            time.sleep(0.5)
            with b:
                pass
    elif cause == "io_wait":
        fifo = folder / "no-writer.fifo"
        os.mkfifo(fifo)
        with open(fifo) as f:
            f.read()
    elif cause == "gil_regex":
        re.match(r"(a+)+$", "a" * 64 + "b")
    elif cause == "gil_pydll":
        import ctypes

        ctypes.PyDLL(None).sleep(3600)
    elif cause == "stopped":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif cause == "oom":
        hog = []
        while True:  # 256 MiB written at a time (repetition fills it): the limit is reached in well under a second
            hog.append(bytearray(b"x") * (256 << 20))
    elif cause == "exception":
        raise RuntimeError("injected failure: the batch had no labels")
    elif cause == "sleeping":
        threading.Event().wait()
    elif cause == "native_busy":
        import torch

        a = torch.ones(2048, 2048)
        while True:
            a = torch.mm(a, a).clamp_(0, 1)
    elif cause == "thread_wait":
        import queue

        batches: queue.Queue[int] = queue.Queue()

        def produce() -> None:
            raise ValueError("injected failure: a corrupt shard")
        producer = threading.Thread(target=produce, name="batch-producer", daemon=True)
        producer.start()
        producer.join()
        batches.get()
    elif cause == "child_wait":
        import subprocess

        subprocess.run(["sleep", "300"], check=False)
    elif cause == "memory_pressure":
        import mmap

        Path(_env("CGROUP", ""), "cgroup.procs").write_text(str(os.getpid()))  # only new pages are charged there
        big = folder / "pages.bin"
        with open(big, "wb") as f:
            for _ in range(512):
                f.write(bytes(1 << 20))
        with open(big, "rb") as f:
            pages = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            n = 0
            while True:
                for i in range(0, len(pages), 4096):
                    n += pages[i]


def main() -> int:
    import torch
    import torch.distributed as dist

    import fr_otel  # imported before the rendezvous, started after a barrier: every rank's agent starts at once,
    # so a slow import on a busy box is never a rank late to its first collective (the healthy run stays healthy)

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(_env("GLOO_TIMEOUT", "120"))))
    dist.barrier()
    fr_otel.start()
    rank = dist.get_rank()
    markers = _env("MARKERS", os.environ.get("TRAIN_LOOP_MARKERS", ""))
    folder = Path(markers) if markers else None
    _mark(folder, f"pid_rank_{rank}", str(os.getpid()))
    cause, who, at = _env("KIND", ""), int(_env("RANK", "2")), int(_env("STEP", "6"))
    steps = int(_env("STEPS", "12"))
    t = torch.ones(1024)
    if cause == "busy_then_stop" and rank == int(_env("RANK2", "1")):
        def stop_later() -> None:
            while not (folder / f"cause_rank_{who}").exists():
                time.sleep(0.05)
            time.sleep(1.0)
            _mark(folder, f"cause_rank_{rank}", "stopped")
            os.kill(os.getpid(), signal.SIGSTOP)
        assert folder is not None
        threading.Thread(target=stop_later, name="stop-later", daemon=True).start()
    for step in range(steps):
        time.sleep(0.05)
        if cause == "raise_all" and step == at:
            raise RuntimeError(f"injected failure: rank {rank} found no batch")
        if cause and rank == who and step == at:
            _mark(folder, f"cause_rank_{rank}", cause)
            if cause == "exit":
                break
            _fault("python_busy" if cause == "busy_then_stop" else cause, folder or Path("."))
        if cause == "divergence" and rank == who and step == at:
            dist.barrier()  # its data ran out: it waits for the others at the end instead
            continue
        dist.all_reduce(t)
    else:
        dist.barrier()
        _mark(folder, f"done_rank_{rank}", str(time.time()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
