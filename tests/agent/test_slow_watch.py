"""The agent's slow-host line: every rank publishes its waits through the real store, rank 0 judges them."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import time
from datetime import timedelta

import pytest
from support.counting_store import CountingStore

from fr_otel.agent.observe.recorder import Counters
from fr_otel.agent.slow_watch import (
    FORGET_AFTER_S,
    LOG_AFTER_S,
    PUBLISH_EVERY_S,
    SlowWatch,
    decode,
)
from fr_otel.agent.observe.state import GroupStatus
from fr_otel.agent.observe.wait_sampler import WaitSampler, group_waits
from fr_otel.diagnosis.lateness import Holdup, RankWait
from fr_otel.common.ports import unused_tcp_port

dist = pytest.importorskip("torch.distributed")

HOSTS = ["node0", "node0", "node1", "node1", "node2", "node2"]
SHARE = {0: 0.92, 1: 0.91, 2: 0.02, 3: 0.03, 4: 0.92, 5: 0.93}
PER = {0: 0.55, 1: 0.54, 2: 0.01, 3: 0.02, 4: 0.56, 5: 0.55}
LINE = ("node1 (ranks 2-3) has held up default_pg (group 0) for 15 s: peers wait 0.55 s per all_reduce, it waits "
        "0.02 s (92% and 3% of their time)")


STATUSES = (GroupStatus("0", "default_pg", tuple(range(6)), 0, 500, 500),)


def _sampler(rank: int, seconds: float = 31.0) -> WaitSampler:
    """A real wait sampler fed ``seconds`` of a rank waiting SHARE[rank] of every 0.6 s step."""
    sampler = WaitSampler(0.1, enqueue_is_start=True, rng=random.Random(rank))
    t, period, wait = 0.0, 0.6, SHARE[rank] * 0.6
    while t < seconds:
        k = math.floor(t / period)
        sampler.sample({0: Counters(k + 1, -1, k + 1 if t - k * period >= wait else k)}, int(t * 1e9))
        t += sampler.gap_s()
    return sampler


def _rank_waits(slow: bool = True) -> list[RankWait]:
    return [RankWait(r, HOSTS[r], "0", "default_pg", SHARE[r] if slow else 0.5, PER[r], 50) for r in range(6)]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def store() -> object:
    """A real TCPStore (the job's store in a real run)."""
    port = unused_tcp_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    yield server
    del server


def _channel(port: int) -> object:
    from fr_otel.agent.links.channel import IncidentChannel

    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=3))
    return IncidentChannel(dist.PrefixStore("fr_otel/job/", client), "test")


def test_a_slow_host_is_said_once_after_it_lasted_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    """Seen at every comparison for 15 s: one line naming node1 and its ranks; later sightings say nothing;
    30 s without it: one line that it ended. The waiting ranks never get a line."""
    clock, raised = Clock(), []
    watch = SlowWatch(None, 0, 6, "node0", comparer=True, recent_op=lambda pg: "all_reduce",  # type: ignore[arg-type]
                      on_holdup=lambda h, line: raised.append((h.host, h.ranks)), clock=clock)
    said = []
    with caplog.at_level(logging.INFO, logger="fr_otel.agent"):
        for _ in range(int(LOG_AFTER_S / PUBLISH_EVERY_S) + 3):  # seen from 1000 s to 1025 s
            said += watch.judge(_rank_waits(), clock.t)
            clock.t += PUBLISH_EVERY_S
        assert said == [LINE] and raised == [("node1", (2, 3))]
        while clock.t <= 1025 + FORGET_AFTER_S:
            said += watch.judge(_rank_waits(slow=False), clock.t)
            clock.t += PUBLISH_EVERY_S
    assert said == [LINE, "node1 no longer holds up group 0 (it did for 25 s)"]
    assert [r.getMessage() for r in caplog.records] == said


def test_a_holdup_that_comes_and_goes_faster_than_it_lasts_is_not_said() -> None:
    """Seen, missed by one comparison, seen again: the count goes on (it restarts only after 30 s unseen)."""
    clock = Clock()
    watch = SlowWatch(None, 0, 6, "node0", comparer=True, clock=clock)  # type: ignore[arg-type]
    said = []
    for slow in (True, False, True, True):
        said += watch.judge(_rank_waits(slow), clock.t)
        clock.t += PUBLISH_EVERY_S
    assert len(said) == 1 and "for 15 s" in said[0]


def test_a_host_whose_ranks_cross_the_threshold_one_after_the_other_is_said_once_from_the_first() -> None:
    """Rank 2 alone late at the first two comparisons, then node1 whole, then rank 2 alone again: one line,
    15 s after rank 2 was first seen, naming node1 and its ranks (seen on the throttled lab host: the line came
    10 s later when each of them counted apart, and a second line could follow for rank 2)."""
    clock, raised = Clock(), []
    watch = SlowWatch(None, 0, 6, "node0", comparer=True, recent_op=lambda pg: "all_reduce",  # type: ignore[arg-type]
                      on_holdup=lambda h, line: raised.append((h.host, h.ranks)), clock=clock)
    rank2_alone = [dataclasses.replace(w, share=0.85) if w.rank == 3 else w for w in _rank_waits()]
    said = []
    for waits in [rank2_alone] * 2 + [_rank_waits()] * 2 + [rank2_alone] * 4:
        said += watch.judge(waits, clock.t)
        clock.t += PUBLISH_EVERY_S
    assert said == [LINE] and raised == [("node1", (2, 3))], said


def test_a_second_slow_rank_on_a_host_gets_its_own_line_and_the_host_one_incident() -> None:
    """node1 holds ranks 2-4: rank 2 alone late for 15 s gets a line and the incident; then rank 3 is late too:
    a line for rank 3 (rank 2's is not said again), no second incident."""
    hosts = ["node0", "node0", "node1", "node1", "node1", "node2"]

    def waits(slow: set[int]) -> list[RankWait]:
        return [RankWait(r, hosts[r], "0", "default_pg", 0.02 if r in slow else 0.92, 0.01 if r in slow else 0.55, 50)
                for r in range(6)]
    clock, raised = Clock(), []
    watch = SlowWatch(None, 0, 6, "node0", comparer=True, recent_op=lambda pg: "all_reduce",  # type: ignore[arg-type]
                      on_holdup=lambda h, line: raised.append(h.ranks), clock=clock)
    said = []
    for slow in [{2}] * 4 + [{2, 3}] * 2:
        said += watch.judge(waits(slow), clock.t)
        clock.t += PUBLISH_EVERY_S
    assert [line.split(" has held up")[0] for line in said] == ["rank 2 (node1)", "rank 3 (node1)"], said
    assert raised == [(2,)]


def test_only_the_first_holdups_of_a_job_raise_incidents() -> None:
    """A host that keeps relapsing gets a line each time, but the incident budget is kept for hangs."""
    clock, raised = Clock(), []
    watch = SlowWatch(None, 0, 6, "node0", comparer=True, on_holdup=lambda h, line: raised.append(h),  # type: ignore[arg-type]
                      clock=clock)
    for _ in range(5):
        for slow in [True] * 4 + [False] * 7:
            watch.judge(_rank_waits(slow), clock.t)
            clock.t += PUBLISH_EVERY_S
    assert len(raised) == 2 and all(isinstance(h, Holdup) for h in raised)


def test_every_rank_publishes_through_the_store_and_rank_0_reads_them_all(store: object) -> None:
    """Six ranks publish every 5 s through a real TCPStore; rank 0 reads all six, and reads nothing
    from a rank whose publication is stale or malformed."""
    port = store.port  # type: ignore[attr-defined]
    clock = Clock()
    wall = [1_700_000_000.0]
    watches = [SlowWatch(_channel(port), r, 6, HOSTS[r], comparer=r == 0, clock=clock, wall=lambda: wall[0])
               for r in range(6)]
    samplers = [_sampler(r) for r in range(6)]
    for r, w in enumerate(watches):
        w.poll(samplers[r], STATUSES)
    raw = watches[0].channel.waits(6)  # type: ignore[attr-defined]
    got = decode(raw, wall[0])
    measured = {r: group_waits(samplers[r], STATUSES)[0] for r in range(6)}
    assert {(w.rank, w.host, w.share, w.per_collective_s, w.completed, w.in_flight_s) for w in got} == {
        (r, HOSTS[r], round(m.recent_share, 4), round(m.recent_wait_s, 4), m.recent_completed, 0.0)  # type: ignore[arg-type]
        for r, m in measured.items()}
    assert all(abs(m.recent_share - SHARE[r]) < 0.08 for r, m in measured.items())
    raw[4]["t"] = wall[0] - 60  # rank 4 stopped publishing a minute ago
    raw[5] = json.loads('{"t": "x", "h": 5, "g": [[1, 2]]}')
    raw[3]["g"] = [["0", "default_pg", "nan?", None, 50, 0], ["0", "default_pg", 0.1, None, "50", 0]]
    assert {w.rank for w in decode(raw, wall[0])} == {0, 1, 2}


def test_a_window_too_short_to_compare_is_not_published(store: object) -> None:
    """Just after start (under 10 s sampled) a rank publishes nothing rather than noise."""
    watch = SlowWatch(_channel(store.port), 3, 6, "node1", comparer=False)  # type: ignore[attr-defined]
    watch.poll(_sampler(3, seconds=4.0), STATUSES)
    assert watch.channel.waits(6) == {}  # type: ignore[attr-defined]


def test_a_group_stalled_now_is_not_slow_even_with_completions_in_the_window() -> None:
    """Rank 2 hung 15 s ago: the window still counts the collectives completed before; the waiting
    ranks' collective in flight past the stall floor says hang (the incidents' business), not slowness."""
    hung = [RankWait(r, HOSTS[r], "0", "default_pg", 0.0 if r == 2 else 0.5, None, 20, 0.0 if r == 2 else 15.0)
            for r in range(6)]
    said: dict[float, list[str]] = {5.0: [], math.inf: []}
    for floor in said:
        clock = Clock()
        watch = SlowWatch(None, 0, 6, "node0", comparer=True, stalled_after_s=floor, clock=clock)  # type: ignore[arg-type]
        for _ in range(6):
            said[floor] += watch.judge(hung, clock.t)
            clock.t += PUBLISH_EVERY_S
    assert said[5.0] == [] and said[math.inf] == [("rank 2 (node1) has held up default_pg (group 0) for 15 s: peers "
                                                   "wait 50% of their time, it waits 0%")]


def test_rank_0_spaces_its_comparisons_by_what_they_cost(store: object) -> None:
    """Comparisons that take 0.1 s each (16k ranks take ~0.4 s) come every 20 s, not every 5 s: at
    most 0.5 % of rank 0's time."""
    clock, timer = Clock(), [0.0]

    def slow_timer() -> float:
        timer[0] += 0.1  # each comparison reads it twice: it costs 0.1 s
        return timer[0]

    watch = SlowWatch(_channel(store.port), 0, 6, "node0", comparer=True, clock=clock,  # type: ignore[attr-defined]
                      timer=slow_timer)
    sampler = _sampler(0)
    for _ in range(12):  # 60 s of polls every 5 s
        clock.t += PUBLISH_EVERY_S
        watch.poll(sampler, STATUSES)
    assert watch.compare_s == pytest.approx(0.1)
    assert timer[0] == pytest.approx(0.2 * 3)  # three comparisons in 60 s (at 5, 25 and 45 s), not twelve


def test_a_rank_publishes_the_longest_wait_its_polls_saw_in_the_window(store: object) -> None:
    """A collective in flight 8 s twenty seconds ago is still in the publication (a one-off hold-up is
    not slowness); once it has left the 30 s window it is not."""
    clock, wall = Clock(), [1_700_000_000.0]
    watch = SlowWatch(_channel(store.port), 1, 6, "node0", comparer=False, clock=clock,  # type: ignore[attr-defined]
                      wall=lambda: wall[0])
    sampler = _sampler(1)
    stuck = (GroupStatus("0", "default_pg", tuple(range(6)), 0, 501, 500, 501, int((wall[0] - 8) * 1e9)),)
    watch.poll(sampler, stuck)
    published = []
    for _ in range(8):
        clock.t += PUBLISH_EVERY_S
        wall[0] += PUBLISH_EVERY_S
        watch.poll(sampler, STATUSES)
        published.append(watch.channel.waits(6)[1]["g"][0][5])  # type: ignore[attr-defined]
    assert published == [8.0] * 6 + [0.0] * 2


def test_with_node_leaders_the_waits_ride_in_the_node_heartbeats_and_rank_0_still_sees_everyone(
        store: object, tmp_path: object, caplog: pytest.LogCaptureFixture) -> None:
    """Six ranks on three nodes of two, each node's rank 0 leading: the members leave their waits in the node
    folder and make no store request for them, the leaders send them in their heartbeat (no request of its
    own), and rank 0 reads every rank's and names node1, as through the store. 0.2 requests/s per rank, 20,000
    a second at 100k ranks, before."""
    from pathlib import Path

    from fr_otel.agent.links.node_channel import NodeChannel
    from fr_otel.agent.links.node_leader import NodeRole
    from fr_otel.read.rank_process import RankProcess

    port = store.port  # type: ignore[attr-defined]
    clock = Clock()
    wall = [1_700_000_000.0]
    roles, watches = [], []
    for r in range(6):
        channel = _channel(port)
        role = NodeRole(channel, NodeChannel(Path(str(tmp_path)) / HOSTS[r], r), r,  # type: ignore[arg-type]
                        RankProcess(host=HOSTS[r], pid=100 + r, local_rank=r % 2), leader=r % 2 == 0,
                        poll_interval=0.1, world_size=6)
        roles.append(role)
        watches.append(SlowWatch(channel, r, 6, HOSTS[r], comparer=r == 0, clock=clock,  # type: ignore[arg-type]
                                 wall=lambda: wall[0], node=role))
    for role in roles:  # the leaders' boards are up: their members are relayed
        if role.leader:
            role.publish_board()
    for role in roles:
        role.poll(time.time_ns())
    samplers = [_sampler(r) for r in range(6)]
    for r, w in enumerate(watches):
        w.poll(samplers[r], STATUSES)
    for role in roles:
        if role.leader:
            role.beat(time.time_ns())
    assert watches[0].channel.waits(6) == {}  # type: ignore[attr-defined]
    assert {w.rank for w in decode(watches[0].everyone(), wall[0])} == set(range(6))
    with caplog.at_level(logging.WARNING, logger="fr_otel.agent"):
        for _ in range(4):
            clock.t += 5
            watches[0].judge(decode(watches[0].everyone(), wall[0]), clock.t)
    assert any(r.getMessage().startswith("node1 (ranks 2-3) has held up default_pg") for r in caplog.records)


def test_rank_0_reads_a_thousand_ranks_waits_from_their_node_heartbeats_in_a_few_requests(store: object) -> None:
    """1,024 ranks on 128 nodes whose leaders carry their waits, and 2 ranks (a lost leader's) that publish on
    their own: rank 0 reads all 1,024 in a handful of requests (the nodes, their heartbeats in batches of 256,
    the list of own publishers and their keys), never one per rank (it made 1,024 before the list)."""
    from fr_otel.agent.links.channel import IncidentChannel

    port = store.port  # type: ignore[attr-defined]
    wall = 1_700_000_000.0
    writer = _channel(port)
    summary = {"t": wall, "h": "h", "g": [["0", "default_pg", 0.5, 0.1, 50, 0.0]]}
    for n in range(128):
        number = writer.register_node(8 * n, 1026)  # type: ignore[attr-defined]
        ranks = [r for r in range(8 * n, 8 * n + 8) if r not in (1000, 1001)]
        writer.node_heartbeat(number, {"host": f"node{n}", "leader": 8 * n, "t": 1,  # type: ignore[attr-defined]
                                       "ranks": {}, "waits": {str(r): summary for r in ranks}})
    for r in (1000, 1001):
        _channel(port).publish_waits(r, summary)  # type: ignore[attr-defined]
    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=3))
    counted = CountingStore(dist.PrefixStore("fr_otel/job/", client))
    watch = SlowWatch(IncidentChannel(counted, "test"), 0, 1024, "node0", comparer=True)  # type: ignore[arg-type]
    got = decode(watch.everyone(), wall)
    assert {w.rank for w in got} == set(range(1024))
    assert counted.requests <= 8, counted.requests


def test_malformed_waits_are_skipped_rank_by_rank_and_never_stop_a_comparison() -> None:
    """What a buggy or old agent may leave: groups that are not a list, numbers too large for a float, a stamp
    from the future or of another type, a rank that is not ASCII digits. Each such rank is left out; the
    others are compared."""
    wall = 1_700_000_000.0
    good = {"t": wall, "h": "h", "g": [["0", "g", 0.5, 0.1, 50, 0.0]]}
    raw = {0: good, 1: {**good, "g": 5}, 2: {**good, "g": [["0", "g", 10**400, None, 50, 0]]},
           3: {**good, "t": 10**400}, 4: {**good, "t": wall + 3600}, 5: {**good, "t": True},
           6: {**good, "g": [["0", "g", 0.5, None, 50, float("inf")]]}, 7: good}
    assert {w.rank for w in decode(raw, wall)} == {0, 7}  # type: ignore[arg-type]
