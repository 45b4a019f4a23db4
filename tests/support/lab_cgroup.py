"""A CPU limit on a lab host's processes: the slow host, from a cgroup's CPU bandwidth quota.

cgroup v2's ``cpu.max`` where the cpu controller is on the unified hierarchy; else cgroup v1's
``cpu.cfs_quota_us``. On the dev box (Debian 12 VM, hybrid layout) cgroup v2 is mounted at
/sys/fs/cgroup/unified with no cpu controller (it is bound to v1 at /sys/fs/cgroup/cpu), so
the v1 file is what works there.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuLimit", "cpu_cgroup_parents", "own_cgroup_path", "stale_cpu_limits"]

PERIOD_US = 100_000


def own_cgroup_path(v1_controller: str | None) -> str:
    """Our own cgroup's path in the hierarchy of ``v1_controller`` (None: the unified one)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (v1_controller is None and controllers == "") or (v1_controller in controllers.split(",")):
            return path.lstrip("/")
    return ""


def cpu_cgroup_parents() -> Iterator[tuple[str, Path]]:
    """Where a CPU-limited child cgroup can go, best first: ("v2", dir) and/or ("v1", dir)."""
    mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    for _, where, kind, options, *_ in mounts:
        if kind == "cgroup2":
            parent = Path(where) / own_cgroup_path(None)
            controllers = (parent / "cgroup.controllers")
            if controllers.exists() and "cpu" in controllers.read_text().split():
                yield "v2", parent
    for _, where, kind, options, *_ in mounts:
        if kind == "cgroup" and "cpu" in options.split(","):
            yield "v1", Path(where) / own_cgroup_path("cpu")


@dataclass
class CpuLimit:
    """One child cgroup holding a host's processes to a CPU fraction."""

    version: str
    path: Path

    @classmethod
    def create(cls, name: str) -> CpuLimit:
        """A new cgroup ``name`` under the first hierarchy that takes one; RuntimeError naming why none did."""
        problems: list[str] = []
        for version, parent in cpu_cgroup_parents():
            try:
                if version == "v2":
                    (parent / "cgroup.subtree_control").write_text("+cpu")
                (parent / name).mkdir()
                return cls(version, parent / name)
            except OSError as exc:
                problems.append(f"{version} at {parent}: {exc.strerror or exc}")
        raise RuntimeError("no writable cgroup cpu controller: " + ("; ".join(problems) or "none mounted"))

    def set(self, cpu_fraction: float, pids: Sequence[int]) -> str:
        """Limit to ``cpu_fraction`` of one CPU and move ``pids`` in; returns the file written."""
        quota = max(1000, int(cpu_fraction * PERIOD_US))
        if self.version == "v2":
            target = self.path / "cpu.max"
            target.write_text(f"{quota} {PERIOD_US}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            target = self.path / "cpu.cfs_quota_us"
            target.write_text(str(quota))
        for pid in pids:
            try:
                (self.path / "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                if exc.errno != errno.ESRCH:  # gone meanwhile: nothing to limit
                    raise
        return str(target)

    def remove(self, timeout: float = 5.0) -> None:
        """Delete the cgroup once its processes are gone (any still there move to the parent first)."""
        deadline = time.monotonic() + timeout
        while self.path.exists():
            try:
                self.path.rmdir()
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    return
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    (self.path.parent / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            time.sleep(0.05)


def stale_cpu_limits(owner_gone: Callable[[str], bool]) -> list[CpuLimit]:
    """Cgroups whose name ``owner_gone`` says a dead lab left."""
    found = []
    for version, parent in cpu_cgroup_parents():
        try:
            children = [p for p in parent.iterdir() if p.is_dir() and owner_gone(p.name)]
        except OSError:
            continue
        found += [CpuLimit(version, p) for p in children]
    return found


if __name__ == "__main__":
    for version, parent in cpu_cgroup_parents():
        print(version, parent, "writable" if os.access(parent, os.W_OK) else "read-only")
