"""Reading on all cores gives the same dumps as reading in one process."""

from __future__ import annotations

import gc
import os
import pickle
from pathlib import Path

import pytest

from fr_otel.read import reader
from fr_otel.read.reader import read_dumps


def _model(result: reader.ReadResult) -> dict[int, tuple]:
    return {r: (d.histories, [e for e in d.tail], d.pg_status, d.pg_config, d.fingerprints, d.latest_ns, d.entries)
            for r, d in result.dumps.items()}


@pytest.mark.parametrize("workers", [2, 3])
def test_parallel_read_with_this_process_parsing_too_equals_a_serial_read(nvrx: Path, workers: int,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Pool workers plus this process (batches taken from both ends) give the same columns, tails and entries."""
    serial = read_dumps(nvrx / "lock_gil_1st", workers=1)
    monkeypatch.setattr(reader, "_PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(reader, "_BATCH_FILES", 1)
    parallel = read_dumps(nvrx / "lock_gil_1st", workers=workers)
    assert len(parallel.dumps) == len(serial.dumps) == 16
    assert parallel.problems == serial.problems
    assert _model(parallel) == _model(serial)


def test_the_default_pool_fits_the_cpus_this_process_may_run_on_not_the_machine() -> None:
    """Pinned to one CPU (as by taskset or a cpuset), the reader counts one CPU, where os.cpu_count()
    still counts every core of the host."""
    import subprocess
    import sys

    probe = ("import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); "
             "from fr_otel.common.cpus import usable_cpus; print(usable_cpus(), os.cpu_count())")
    one_cpu = min(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", probe, str(one_cpu)], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "1"
    assert int(out[1]) == os.cpu_count()


def test_with_one_usable_cpu_a_large_job_is_read_in_this_process_without_a_pool(
        nvrx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default worker count comes from usable_cpus(): with one CPU no pool is started however
    large the job, and the dumps are the same as a serial read."""
    serial = read_dumps(nvrx / "lock_gil_1st", workers=1)
    monkeypatch.setattr(reader, "_PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(reader, "usable_cpus", lambda: 1)

    def no_pool(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process pool was started with one usable CPU")

    monkeypatch.setattr(reader, "ProcessPoolExecutor", no_pool)
    assert _model(read_dumps(nvrx / "lock_gil_1st")) == _model(serial)
    monkeypatch.setattr(reader, "usable_cpus", lambda: 2)
    with pytest.raises(AssertionError, match="process pool was started"):
        read_dumps(nvrx / "lock_gil_1st")


def test_the_workers_result_pipe_is_widened_so_a_worker_does_not_wait_for_this_process() -> None:
    """On this Linux Python the reader's pool gets a 1 MiB result pipe (64 KiB by default held less
    than two dumps' results: a worker waited ~4 ms per batch for this busy process to read);
    where that cannot be done the default pipe stays and nothing fails."""
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        pytest.skip("pipes cannot be resized here (not Linux)")
    from concurrent.futures import ProcessPoolExecutor

    probe_r, probe_w = os.pipe()
    try:
        fcntl.fcntl(probe_w, fcntl.F_SETPIPE_SZ, reader._RESULT_PIPE_BYTES)
    except OSError:
        pytest.skip("this system's fs/pipe-max-size (or pipe quota) allows no 1 MiB pipe")
    finally:
        os.close(probe_r)
        os.close(probe_w)
    with ProcessPoolExecutor(max_workers=1) as pool:
        pipe = pool._result_queue._writer.fileno()  # type: ignore[attr-defined]
        before = fcntl.fcntl(pipe, fcntl.F_GETPIPE_SZ)
        reader._widen_result_pipe(pool)
        assert before < fcntl.fcntl(pipe, fcntl.F_GETPIPE_SZ) == reader._RESULT_PIPE_BYTES
        assert pool.submit(sum, [1, 2]).result() == 3

    class Elsewhere:  # another Python's private layout
        pass

    reader._widen_result_pipe(Elsewhere())  # type: ignore[arg-type]


def test_cycles_in_a_hostile_dump_are_freed_after_each_file_while_the_collector_is_paused(tmp_path: Path) -> None:
    """The parallel read pauses automatic GC (a pool worker is even forked with it off), so a pickle
    holding cycles (a list that holds itself, next to 20 000 more lists) would pile up file after file;
    each file's young generation is collected as soon as it is parsed."""
    paths = []
    for rank in range(3):
        loop: list = [[] for _ in range(20_000)]
        loop.append(loop)
        path = tmp_path / f"rank_{rank}"
        path.write_bytes(pickle.dumps({"version": "2.10", "entries": [], "pg_status": {}, "junk": loop}))
        paths.append((rank, str(path)))
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # as in a pool worker
    try:
        parsed = reader._parse_batch(paths)
        left = gc.collect()
    finally:
        if was_enabled:
            gc.enable()
    assert [d.rank for d, _ in parsed if d is not None] == [0, 1, 2]
    assert left < 1_000, f"{left} objects of the dumps' cycles were still waiting for the collector"
