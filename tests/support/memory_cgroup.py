"""A memory limit on a job's processes, as a pod's container has: a child of this process's memory cgroup.

cgroup v1's ``memory.limit_in_bytes`` where the memory controller is mounted on its own (this box's hybrid
layout: /sys/fs/cgroup/memory), else cgroup v2's ``memory.max`` (with ``memory.swap.max`` 0). A job started
through :meth:`MemoryLimit.wrap` runs inside it from its first process on, so every rank shares it, and its
OOM killer kills the biggest of them when the limit is reached.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from support.lab_cgroup import own_cgroup_path

__all__ = ["MemoryLimit"]


@dataclass
class MemoryLimit:
    """One child memory cgroup, limited."""

    version: str
    path: Path

    @classmethod
    def create(cls, name: str, limit_bytes: int) -> MemoryLimit:
        """A new cgroup ``name`` limited to ``limit_bytes``; RuntimeError naming why none could be made."""
        problems = []
        v1 = Path("/sys/fs/cgroup/memory") / own_cgroup_path("memory")
        v2 = Path("/sys/fs/cgroup") / own_cgroup_path(None)
        for version, parent in (("v1", v1), ("v2", v2)):
            try:
                if version == "v1" and not (parent / "memory.limit_in_bytes").exists():
                    raise OSError(errno.ENOENT, "no v1 memory controller")
                if version == "v2":
                    (parent / "cgroup.subtree_control").write_text("+memory")
                (parent / name).mkdir()
                made = cls(version, parent / name)
                if version == "v1":
                    (made.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                else:
                    (made.path / "memory.max").write_text(str(limit_bytes))
                    (made.path / "memory.swap.max").write_text("0")
                return made
            except OSError as exc:
                problems.append(f"{version} at {parent}: {exc.strerror or exc}")
        raise RuntimeError("no writable memory cgroup: " + "; ".join(problems))

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` started inside this cgroup (the shell moves itself in, then becomes ``cmd``)."""
        return ["sh", "-c", f'echo $$ > "{self.path}/cgroup.procs" && exec "$@"', "sh", *cmd]

    def oom_kills(self) -> int:
        """What the cgroup's own counter says (v1 ``memory.oom_control``, v2 ``memory.events``)."""
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self, timeout: float = 10.0) -> None:
        """Delete the cgroup once its processes are gone (killing any left)."""
        deadline = time.monotonic() + timeout
        while self.path.exists() and time.monotonic() < deadline:
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                self.path.rmdir()
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    return
            time.sleep(0.1)
