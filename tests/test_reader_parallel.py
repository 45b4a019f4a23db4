"""Reading on all cores gives the same dumps as reading in one process."""

from __future__ import annotations

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
    """Under taskset / a cpuset of one CPU, the reader counts one CPU (so it reads in-process),
    where os.cpu_count() would still count every core of the host."""
    import os
    import subprocess
    import sys

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this OS")  # pragma: no cover - Linux CI
    probe = "from fr_otel.common.cpus import usable_cpus; import os; print(usable_cpus(), os.cpu_count())"
    one_cpu = min(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, {one_cpu})).stdout.split()
    assert out[0] == "1"
    assert int(out[1]) == os.cpu_count()
