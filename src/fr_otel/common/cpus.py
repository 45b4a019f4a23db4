"""How many CPUs this process may use: the reader sizes its pool by it."""

from __future__ import annotations

import os

__all__ = ["usable_cpus"]


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: ``taskset``, a cpuset), not the machine's count.

    ``os.cpu_count()`` says 16 on a 16-core host even when the job was given 2 of them, and a
    pool of 16 workers on 2 CPUs only adds memory and switching. A CPU quota (``cpu.max``) is
    not an affinity and is not seen here.
    """
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
