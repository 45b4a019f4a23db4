"""What node leaders claim is trusted no further than the job's shape and this host's clock: a heartbeat from
the future counts as now, ranks outside the world are dropped, and a rank two nodes both send is kept once."""

from __future__ import annotations

import pickle
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from support.hostile_dumps import WORLD, nccl_dump, write_job
from support.node_ranks import flat_rank, store_channel

from fr_otel.agent.incident.rank import IncidentRank
from fr_otel.agent.observe.payload import encode_payload
from fr_otel.agent.incident.gather import _Summaries, gather, read_heartbeats
from fr_otel.common.ports import unused_tcp_port
from fr_otel.read.node_summary import NodeSummary, encode_node_summary
from fr_otel.read.rank_process import RankProcess
from fr_otel.read.reader import ReadResult, read_dumps


def _rank_zero(tmp: Path, poll_s: float = 0.2) -> tuple[IncidentRank, dist.TCPStore]:
    """Rank 0 of a WORLD-rank job, on a real loopback TCPStore (the server is returned to keep it up)."""
    port = unused_tcp_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    return flat_rank(tmp, port, 0, world=WORLD, poll=poll_s), server


def test_a_node_heartbeat_from_the_future_counts_as_now_and_ranks_outside_the_job_are_dropped(tmp_path: Path) -> None:
    """A node beating an hour ahead (a skewed clock, a forged file) does not keep its ranks 'heard' for an
    hour, and a rank number beyond the world is never remembered."""
    me, server = _rank_zero(tmp_path)
    hour = 3600 * 10**9
    ahead = time.time_ns() + hour
    n = me.channel.register_node(2, WORLD)
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


def test_a_rank_counted_twice_does_not_end_the_gathering_before_a_live_rank_sends(tmp_path: Path) -> None:
    """Node 0's summary brings ranks 0-1 and rank 1 also sends its own payload (its leader was late): the
    arrival counter reaches the 4 live ranks while rank 3 has not sent yet. The gathering still waits for
    rank 3 (it beat 0 s ago, polls are 1 s: it is alive), which sends 1.5 s later, and names no rank silent."""
    me, server = _rank_zero(tmp_path, poll_s=1.0)
    dumps = read_dumps(write_job(tmp_path / "dumps")).dumps
    process = RankProcess(host="node1", pid=7, local_rank=0, source="agent")
    payload = {r: encode_payload(pickle.dumps(nccl_dump(r)), (), 100, time.time_ns(), process) for r in range(WORLD)}
    now = time.time_ns()
    for rank in range(WORLD):
        me.channel.heartbeat(rank, now)
    me.channel.publish_summary(1, encode_node_summary("node0", 0, now, {0: dumps[0], 1: dumps[1]}), 2)
    me.channel.publish(1, 1, payload[1])  # counted a second time
    me.channel.publish(1, 2, payload[2])  # the counter says 4 of 4
    late = threading.Timer(1.5, store_channel(server.port).publish, args=(1, 3, payload[3]))  # rank 3, its own link
    late.start()
    try:
        evidence = gather(me, 1, time.monotonic() + 20).evidence
    finally:
        late.cancel()
    assert set(evidence.dumps) == set(range(WORLD)), evidence.problems
    assert not any("sent no recorder" in p for p in evidence.problems), evidence.problems
    del server
