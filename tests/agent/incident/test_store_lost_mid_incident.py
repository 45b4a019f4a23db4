"""The job's store goes away in the middle of an incident raised through it (a real TCPStore on loopback,
shut down while the raiser reads its recorder): the incident goes on without it, on this node, under the
same number, and names the lost host from the host map and the heartbeats read before."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

dist = pytest.importorskip("torch.distributed")

from fr_otel.agent.links.channel import IncidentChannel
from fr_otel.agent.config import AgentConfig
from fr_otel.agent.serve.health import HealthTracker
from fr_otel.agent.links.host_map import HostMapKeeper
from fr_otel.agent.incident.rank import IncidentRank, dump_root
from fr_otel.agent.incident.runner import IncidentRunner
from fr_otel.agent.observe.poller import ProgressTracker
from fr_otel.agent.observe.recorder import GroupInfo
from fr_otel.agent.incident.gather import gather
from fr_otel.agent.links.store_link import StoreLink
from fr_otel.common.ids import trace_id_for
from fr_otel.otlp.config import ExportConfig
from fr_otel.read.rank_process import RankProcess
from fr_otel.testing.dump_builder import DumpBuilder
from fr_otel.testing.otlp import wait_for
from fr_otel.common.ports import unused_tcp_port
from fr_otel.incident.trigger import Trigger

JOB = "store-lost-mid-incident"
WORLD = 6
HOST = {r: f"node{r // 2}" for r in range(WORLD)}  # node0 runs the store; node1 crashed; ranks 4-5 are node2


def _dumps() -> tuple[DumpBuilder, int]:
    """12 all_reduces done by all; #13 entered by ranks 0, 1, 4, 5 and never completed (2, 3 are gone)."""
    job = DumpBuilder(WORLD, backend="gloo")
    for _ in range(12):
        job.collective(job.world)
    job.collective(job.world, ranks=[0, 1, 4, 5], done=False)
    return job, job.clock


class _Server:
    """The job's store: a TCPStore server on loopback that the test can take away."""

    def __init__(self) -> None:
        self.port = unused_tcp_port()
        self.store: Any = dist.TCPStore("127.0.0.1", self.port, is_master=True, wait_for_workers=False,
                                        timeout=timedelta(seconds=10))

    def client(self) -> Any:
        """A client: its connect may wait 10 s on a loaded box (2 s once timed out in CI); each call of a rank's
        channel is bounded by the channel's own link (2 s) whatever the client's timeout."""
        return dist.TCPStore("127.0.0.1", self.port, is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=10))

    def stop(self) -> None:
        self.store = None  # the last reference: the server closes every connection


def _rank(rank: int, server: _Server, tmp: Path, raw: Any, **config: Any) -> IncidentRank:
    """Rank ``rank`` of the 3x2 job as the agent builds it, its recorder ``raw()``, its store a real client."""
    channel = IncidentChannel(dist.PrefixStore(f"fr_otel/{JOB}/", server.client()), "test", StoreLink(2.0),
                              f"127.0.0.1:{server.port}")
    settings = AgentConfig(**{"out_dir": str(tmp / "out"), "metrics_port": None, "poll_interval": 0.2, **config})
    process = RankProcess(host=HOST[rank], pid=os.getpid(), local_rank=rank % 2, source="agent")
    hosts = HostMapKeeper(channel, rank, WORLD, process, leader=rank % 2 == 0, folders=lambda: [dump_root(settings)])
    hosts.processes.update({r: RankProcess(host=h, pid=1000 + r, local_rank=r % 2, source="agent")
                            for r, h in HOST.items() if r != rank})
    hosts.store_host = "node0"
    groups = (GroupInfo("0", "default_pg", tuple(range(WORLD)), 0),)
    return IncidentRank(settings, ExportConfig(), HealthTracker(), channel, JOB, rank, WORLD, process, raw,
                        lambda: groups, hosts)


def test_a_store_that_dies_mid_incident_leaves_a_local_verdict_naming_the_lost_host(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Rank 4 raises incident 1 through the store, rank 5 joins; the store's server goes while rank 4 reads
    its recorder: node2 still writes incident 1 (same trace id) from both its ranks' recorders, naming node1
    (ranks 2-3) lost with when it was last heard, never healthy, within the incident's bound."""
    caplog.set_level(logging.WARNING, logger="fr_otel.agent")
    job, stall = _dumps()
    server = _Server()
    beats = IncidentChannel(dist.PrefixStore(f"fr_otel/{JOB}/", server.client()), "test")
    for r in range(WORLD):  # node1 stopped beating 4 s before the stall; the others beat on
        beats.heartbeat(r, stall - 4 * 10**9 if HOST[r] == "node1" else stall + 2 * 10**9)
    go = threading.Event()

    def raiser_recorder() -> bytes:
        go.wait(10)  # the store goes while the raiser reads its recorder
        return job.dump(4)

    four = IncidentRunner(_rank(4, server, tmp_path, raiser_recorder, gather_seconds=4.0), ProgressTracker())
    five = IncidentRunner(_rank(5, server, tmp_path, lambda: job.dump(5), gather_seconds=4.0), ProgressTracker())
    began = time.monotonic()
    raised = four.raise_incident(Trigger.requested("stall"), deadline=began + 20)
    joined = five.join_open()
    assert raised is not None and len(joined) == 1
    assert wait_for(lambda: beats.arrived(1) >= 1, 10, 0.05), "rank 5 never sent its recorder"
    server.stop()
    go.set()
    assert raised.wait(25) and joined[0].wait(25)
    took = time.monotonic() - began
    trace = f"{trace_id_for(JOB, '1'):032x}"
    incident = json.loads((tmp_path / "out" / "dumps" / trace / "incident.json").read_text())
    summary = incident["summary"]
    assert incident["incident"] == "1" and summary["verdict"] == "hang", summary
    (node1,) = [h for h in summary["hosts"] if h["host"] == "node1"]
    assert (node1["state"], node1["missing"], node1["last_heard_ns"]) == ("lost", [2, 3], stall - 4 * 10**9)
    assert {c["rank"] for c in summary["culprits"] if c["kind"] == "missing_dump"} >= {2, 3}
    assert not {c["rank"] for c in summary["culprits"] if c["kind"] != "unknown"} & {4, 5}
    where = json.loads((tmp_path / "out" / "dumps" / trace / "ranks.json").read_text())["ranks"]
    assert sorted(where) == [str(r) for r in range(WORLD)] and where["2"]["host"] == "node1"  # every rank's host
    assert (tmp_path / "out" / "dumps" / trace / "fr_trace_rank_5").is_file()
    assert any("went away during it" in r.getMessage() for r in caplog.records)
    assert took < 20, f"the incident took {took:.1f} s"


def test_the_ranks_a_slow_incident_is_about_are_waited_for_however_late_their_heartbeat(tmp_path: Path) -> None:
    """A throttled host beats late: the coordinator of the incident about its ranks still waits for their
    recorders (within the gathering's bound) instead of presuming them lost and calling the verdict without."""
    job, _ = _dumps()
    server = _Server()
    zero = _rank(0, server, tmp_path, lambda: job.dump(0), gather_seconds=8.0, poll_interval=1.0)
    two = _rank(2, server, tmp_path, lambda: job.dump(2))
    now = time.time_ns()
    for r in range(WORLD):  # rank 2's last beat is 30 s old: its CPU is throttled
        zero.channel.heartbeat(r, now - 30 * 10**9 if r == 2 else now)
    for r in (0, 1, 3, 4, 5):
        zero.channel.publish(1, r, _payload(zero, job.dump(r)))
    late = threading.Timer(1.5, lambda: two.channel.publish(1, 2, _payload(two, job.dump(2))))
    late.start()
    try:
        began = time.monotonic()
        evidence = gather(zero, 1, time.monotonic() + 20, expected=[2, 3]).evidence
    finally:
        late.cancel()
    assert 2 in evidence.dumps, evidence.problems
    assert time.monotonic() - began < 8


def _payload(me: IncidentRank, raw: bytes) -> bytes:
    from fr_otel.agent.observe.payload import encode_payload

    return encode_payload(raw, me.groups(), 64, time.time_ns(), me.process, steps=None)
