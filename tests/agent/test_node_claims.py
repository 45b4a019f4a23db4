"""What node leaders claim is trusted no further than the job's shape and this host's clock: a heartbeat from
the future counts as now, ranks outside the world are dropped, and a rank two nodes both send is kept once."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from support.hostile_dumps import WORLD, write_job

from fr_otel.agent.channel import IncidentChannel
from fr_otel.agent.config import AgentConfig
from fr_otel.agent.health import HealthTracker
from fr_otel.agent.host_map import HostMapKeeper
from fr_otel.agent.incident_rank import IncidentRank
from fr_otel.agent.store_gather import _Summaries, read_heartbeats
from fr_otel.common.ports import unused_tcp_port
from fr_otel.otlp.config import resolve_export_config
from fr_otel.read.node_summary import NodeSummary
from fr_otel.read.rank_process import RankProcess
from fr_otel.read.reader import ReadResult, read_dumps


def _rank_zero(tmp: Path) -> tuple[IncidentRank, dist.TCPStore]:
    """Rank 0 of a WORLD-rank job, on a real loopback TCPStore."""
    port = unused_tcp_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=10))
    channel = IncidentChannel(dist.PrefixStore("fr_otel/claims/", client), "test")
    me = RankProcess(host="node0", pid=1, local_rank=0, source="agent")
    config = AgentConfig(out_dir=str(tmp), dump_dir=str(tmp), metrics_port=None, poll_interval=0.2)
    rank = IncidentRank(config, resolve_export_config(environ={}, timeout_s=10), HealthTracker(), channel, "claims",
                        0, WORLD, me, lambda: b"", tuple,
                        HostMapKeeper(channel, 0, WORLD, me, leader=False, folders=list))
    return rank, server


def test_a_node_heartbeat_from_the_future_counts_as_now_and_ranks_outside_the_job_are_dropped(tmp_path: Path) -> None:
    """A node beating an hour ahead (a skewed clock, a forged file) does not keep its ranks 'heard' for an
    hour, and a rank number beyond the world is never remembered."""
    me, server = _rank_zero(tmp_path)
    hour = 3600 * 10**9
    ahead = time.time_ns() + hour
    n = me.channel.register_node()
    me.channel.node_heartbeat(n, {"host": "node1", "leader": 2, "t": ahead,
                                  "ranks": {"2": ahead, "3": ahead, str(WORLD + 5): ahead}})
    before = time.time_ns()
    hosts, _ = read_heartbeats(me)
    assert set(me.channel.heard) >= {2, 3} and WORLD + 5 not in me.channel.heard and WORLD + 5 not in hosts
    assert all(me.channel.heard[r] <= time.time_ns() < before + hour // 2 for r in (2, 3)), me.channel.heard
    del server


def test_a_summary_s_foreign_and_repeated_ranks_are_not_taken(tmp_path: Path) -> None:
    """A node summary naming a rank outside the job, or a rank another node's summary already sent, adds
    neither (one problem line each); the first node's rank stays as it was."""
    me, server = _rank_zero(tmp_path)
    dumps = read_dumps(write_job(tmp_path / "dumps")).dumps
    read = ReadResult()
    summaries = _Summaries(me, 1, read)
    now = time.time_ns()
    summaries._add(NodeSummary("node0", 0, now, dumps={0: dumps[0], 1: dumps[1]}, heard={0: now, 1: now}))
    summaries._add(NodeSummary("node9", 2, now, dumps={1: dumps[2], WORLD + 1: dumps[3]}, heard={WORLD + 1: now}))
    assert read.dumps[1] is dumps[1] and WORLD + 1 not in read.dumps and WORLD + 1 not in me.channel.heard
    assert any("outside the job" in p and "node9" in p for p in read.problems), read.problems
    assert any("repeats rank(s) 1" in p for p in read.problems), read.problems
    del server
