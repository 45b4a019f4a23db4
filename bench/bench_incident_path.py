"""How many of the agent's files one live incident walks through, and how often it comes back to one it left.

Two ranks of a two-rank job live in this process, each with its own client of a real TCPStore on loopback:
rank 0 raises an incident for a stall on the default group, rank 1 joins it; rank 0 coordinates, analyses and
writes the incident's files (no collector: the export fails fast on a closed loopback port). Every Python call
and return on the threads that do incident work is recorded (``sys.setprofile`` and ``threading.setprofile``)
and reduced, per thread, to the sequence of ``fr_otel/agent`` files the work is in. Printed per thread and in
total: the files entered, and the returns (entering a file the path had left before, not counting the file
it just came from: a call's return to its caller is that, a walk back and forth between rooms is more).

A measure of how spread out the incident protocol is, not of time. Runs against the agent's layout before and
after its rooms (``fr_otel.agent.incident.*`` or the flat ``fr_otel.agent.*``): the numbers in the closing note
of the rooms' change were taken with this script on both commits.

    .venv/bin/python bench/bench_incident_path.py
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import torch.distributed as dist

from fr_otel.common.ports import unused_tcp_port
from fr_otel.otlp.config import ExportConfig
from fr_otel.read.rank_process import RankProcess
from fr_otel.testing.dump_builder import DumpBuilder

AGENT = str(Path(importlib.import_module("fr_otel.agent").__file__ or "").parent) + os.sep
JOB, WORLD = "incident-path", 2
HARNESS = "bench harness"


def _first(*names: str) -> Any:
    """The first of ``module:attribute`` names that imports (the rooms' layout, else the flat one)."""
    for name in names:
        module, attr = name.split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
    raise ImportError(names)


IncidentChannel = _first("fr_otel.agent.links.channel:IncidentChannel", "fr_otel.agent.channel:IncidentChannel")
StoreLink = _first("fr_otel.agent.links.store_link:StoreLink", "fr_otel.agent.store_link:StoreLink")
HostMapKeeper = _first("fr_otel.agent.links.host_map:HostMapKeeper", "fr_otel.agent.host_map:HostMapKeeper")
HealthTracker = _first("fr_otel.agent.serve.health:HealthTracker", "fr_otel.agent.health:HealthTracker")
AgentConfig = _first("fr_otel.agent.config:AgentConfig")
IncidentRank = _first("fr_otel.agent.incident.rank:IncidentRank", "fr_otel.agent.incident_rank:IncidentRank")
dump_root = _first("fr_otel.agent.incident.rank:dump_root", "fr_otel.agent.incident_rank:dump_root")
IncidentRunner = _first("fr_otel.agent.incident.runner:IncidentRunner", "fr_otel.agent.incident_runner:IncidentRunner")
ProgressTracker = _first("fr_otel.agent.observe.poller:ProgressTracker", "fr_otel.agent.poller:ProgressTracker")
Stall = _first("fr_otel.agent.observe.poller:Stall", "fr_otel.agent.poller:Stall")
GroupInfo = _first("fr_otel.agent.observe.recorder:GroupInfo", "fr_otel.agent.recorder:GroupInfo")
GroupStatus = _first("fr_otel.agent.observe.state:GroupStatus", "fr_otel.agent.state:GroupStatus")


class PathRecorder:
    """Per thread, the agent files the work enters, in order, and the files it comes back to after it had
    finished with them (called into again while no frame of theirs is on the stack)."""

    def __init__(self) -> None:
        self.entered: dict[str, list[str]] = defaultdict(list)
        self.back: dict[str, list[str]] = defaultdict(list)
        self.on = False
        self._stacks: dict[int | None, list[str | None]] = defaultdict(list)
        self._workers: dict[int | None, int] = {}

    def _key(self) -> str:
        """Worker threads by order of first call (rank 0's incident worker starts first)."""
        thread = threading.current_thread()
        if thread is threading.main_thread():
            return thread.name
        return f"{thread.name} {self._workers.setdefault(thread.ident, len(self._workers))}"

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event not in ("call", "return"):
            return
        stack = self._stacks[threading.get_ident()]
        if event == "return":
            if stack:
                stack.pop()
            return
        file = frame.f_code.co_filename
        name = file[len(AGENT):] if file.startswith(AGENT) else None
        if name is not None:
            key = self._key()
            if name not in self.entered[key]:
                self.entered[key].append(name)
            elif name not in stack:
                self.back[key].append(name)
        stack.append(name)


def one_incident(tmp: Path, recorder: PathRecorder) -> None:
    job = DumpBuilder(WORLD, backend="gloo")
    for _ in range(5):
        job.collective(job.world)
    job.collective(job.world, ranks=[1], done=False)
    port = unused_tcp_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    groups = (GroupInfo("0", "default_pg", tuple(range(WORLD)), 0),)
    runners = []
    for rank in range(WORLD):
        client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=10))
        channel = IncidentChannel(dist.PrefixStore(f"fr_otel/{JOB}/", client), "bench", StoreLink(2.0), f"127.0.0.1:{port}")
        config = AgentConfig(out_dir=str(tmp / "out"), metrics_port=None, poll_interval=0.2, gather_seconds=5.0)
        process = RankProcess(host="bench", pid=os.getpid(), local_rank=rank, source="agent")
        hosts = HostMapKeeper(channel, rank, WORLD, process, leader=rank == 0,
                              folders=lambda config=config: [dump_root(config)])
        export = ExportConfig(endpoint=f"http://127.0.0.1:{unused_tcp_port()}", timeout_s=2.0)
        me = IncidentRank(config, export, HealthTracker(), channel, JOB, rank, WORLD, process,
                          lambda rank=rank: job.dump(rank), lambda: groups, hosts)
        for r in range(WORLD):
            channel.heartbeat(r, time.time_ns())
        runners.append(IncidentRunner(me, ProgressTracker()))
    status = GroupStatus("0", "default_pg", tuple(range(WORLD)), 0, enqueued=6, completed=5, inflight_seq=6,
                         inflight_since_ns=time.time_ns() - 10**10, exact=True, op="allreduce")
    threading.setprofile(recorder)
    sys.setprofile(recorder)
    recorder.on = True
    try:
        raised = runners[0].raise_for([Stall(status, 10.0, 5.0)])  # the raiser's poll, on this thread
        threading.current_thread().name = "member poll"
        joined = runners[1].join_open()
        threading.current_thread().name = HARNESS  # the waits below are the bench's, not the incident's
        for runner in runners:
            runner.wait_idle(30)
    finally:
        recorder.on = False
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    del raised, joined, server


def main() -> None:
    threading.current_thread().name = "raiser poll"  # renamed "member poll" for rank 1's look
    recorder = PathRecorder()
    with tempfile.TemporaryDirectory() as tmp:
        one_incident(Path(tmp), recorder)
    entered = returned = returns = 0
    for thread in sorted(t for t in recorder.entered if t != HARNESS):
        files, back = recorder.entered[thread], recorder.back[thread]
        entered, returned, returns = entered + len(files), returned + len(set(back)), returns + len(back)
        print(f"{thread:>16}: {len(files):3d} files entered, {len(set(back)):3d} of them come back to "
              f"({len(back)} times)")
        print(f"{'':>18}entered: {' '.join(files)}")
        print(f"{'':>18}come back to: {' '.join(sorted(set(back)))}")
    print(f"{'all threads':>16}: {entered:3d} files entered, {returned:3d} come back to ({returns} times)")


if __name__ == "__main__":
    main()
