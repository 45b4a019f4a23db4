"""The wait sampler: a rank's time in collectives, estimated from its progress counters alone."""

from __future__ import annotations

import math
import random

from fr_otel.agent.observe.recorder import Counters
from fr_otel.agent.observe.wait_sampler import WaitSampler, enqueue_is_start


def _counters(t: float, period: float, wait: float, *, started: bool = False) -> Counters:
    """A rank that enqueues collective k at k*period, waits ``wait`` in it, then computes."""
    k = math.floor(t / period)
    done = k + 1 if t - k * period >= wait else k
    return Counters(k + 1, (k + 1) if started else -1, done)


def _run(sampler: WaitSampler, seconds: float, period: float, wait: float, *, start: float = 0.0,
         fixed_gap: float | None = None, started: bool = False) -> float:
    t = start
    while t < start + seconds:
        sampler.sample({0: _counters(t, period, wait, started=started)}, int(t * 1e9))
        t += fixed_gap if fixed_gap is not None else sampler.gap_s()
    return t


def test_sampled_waits_add_up_to_the_time_a_rank_spends_in_collectives() -> None:
    """A rank waiting 0.55 s of every 0.6 s step, and one waiting 0.01 s: shares and per-collective waits come out."""
    peer = WaitSampler(0.1, enqueue_is_start=True, rng=random.Random(1))
    slow = WaitSampler(0.1, enqueue_is_start=True, rng=random.Random(2))
    _run(peer, 120, 0.6, 0.55)
    _run(slow, 120, 0.6, 0.01)
    p, s = peer.totals()[0], slow.totals()[0]
    assert abs(p.share - 0.55 / 0.6) < 0.03 and abs(s.share - 0.01 / 0.6) < 0.01
    assert 199 <= p.completed <= 200 and 199 <= s.completed <= 200
    assert abs(p.per_collective_s - 0.55) < 0.03 and s.per_collective_s < 0.02


def test_random_gaps_do_not_alias_with_a_step_as_long_as_the_sampling_interval() -> None:
    """Samples every 0.1 s of a 0.1 s step always land in the same phase; random gaps do not."""
    fixed = WaitSampler(0.1, enqueue_is_start=True)
    _run(fixed, 60, 0.1, 0.03, start=0.05, fixed_gap=0.1)
    jittered = WaitSampler(0.1, enqueue_is_start=True, rng=random.Random(3))
    _run(jittered, 60, 0.1, 0.03, start=0.05)
    assert fixed.totals()[0].share < 0.01  # every sample saw the compute phase: the wait is invisible
    assert abs(jittered.totals()[0].share - 0.3) < 0.05


def test_the_recent_window_follows_a_slowdown_the_totals_average_away() -> None:
    """After 5 min of 10 % waits, 30 s of 90 % waits: the window shows 90 %, the totals much less."""
    sampler = WaitSampler(0.1, enqueue_is_start=True, window_s=30.0, rng=random.Random(4))
    t = _run(sampler, 300, 0.5, 0.05)
    _run(sampler, 31, 0.5, 0.45, start=t)
    recent, total = sampler.recent()[0], sampler.totals()[0]
    assert abs(recent.share - 0.9) < 0.06 and 29 <= recent.observed_s <= 33
    assert total.share < 0.25 and abs(recent.per_collective_s - 0.45) < 0.05


def test_started_counters_measure_from_start_and_nccl_without_them_is_not_measured() -> None:
    """NCCL with timing: start -> completion; NCCL without: no series (its enqueue only queues GPU work)."""
    timed = WaitSampler(0.1, enqueue_is_start=False, rng=random.Random(5))
    _run(timed, 30, 0.2, 0.1, started=True)
    assert abs(timed.totals()[0].share - 0.5) < 0.08
    untimed = WaitSampler(0.1, enqueue_is_start=False, rng=random.Random(6))
    _run(untimed, 30, 0.2, 0.1)
    assert untimed.totals() == {} and untimed.samples > 100 and untimed.blind and not timed.blind
    assert enqueue_is_start("gloo") and not enqueue_is_start("nccl") and not enqueue_is_start("cpu:gloo,cuda:nccl")


def test_a_completed_counter_gloo_left_behind_is_corrected_not_counted_as_waiting() -> None:
    """gloo can leave last_completed one behind for good; the poller's correction keeps it from looking like a wait."""
    stuck = WaitSampler(0.1, enqueue_is_start=True)
    fixed = WaitSampler(0.1, enqueue_is_start=True)
    for i in range(100):
        counters = {0: Counters(10, -1, 9)}  # #10 completed, the counter says #9
        stuck.sample(counters, i * 100_000_000)
        fixed.sample(counters, i * 100_000_000, corrected=lambda slot, enq, done: 10)
    assert stuck.totals()[0].share == 1.0 and fixed.totals()[0].share == 0.0


def test_a_thread_held_up_for_seconds_counts_a_bounded_gap() -> None:
    """A 30 s hole between samples (a paused agent) counts as 1 s, not 30 s of whatever it last saw."""
    sampler = WaitSampler(0.1, enqueue_is_start=True)
    sampler.sample({0: Counters(5, -1, 4)}, 0)
    sampler.sample({0: Counters(5, -1, 5)}, 30_000_000_000)
    assert sampler.totals()[0].wait_s == 1.0 and sampler.totals()[0].completed == 1


def test_the_waits_are_two_counters_per_group_with_the_incident_trace_as_exemplar() -> None:
    """fr_collective_wait_seconds_total and fr_collectives_completed_total per group; the wait carries the
    latest incident's trace id (OpenMetrics), valued at the rank's recent share; none without waits."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.openmetrics.exposition import generate_latest

    from fr_otel.agent.serve.metrics import FrCollector
    from fr_otel.agent.observe.state import GroupWait, Health, ProcessInfo, Snapshot

    def text(snapshot: Snapshot) -> str:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(FrCollector(lambda: snapshot, clock=lambda: 1_700_000_000.0))
        return generate_latest(registry).decode()

    health = Health(incidents=1, last_incident_trace_id="8148d8a67990f3e495f51437477419ba",
                    last_incident_s=1_699_999_990.5)
    waits = (GroupWait("0", "default_pg", 512.25, 900, 0.9166, 0.55, 50, 30.0),)
    snap = Snapshot(ProcessInfo("3", "1", "node1", "2.13.0", "gloo", "6", "2000"), True, health=health, waits=waits)
    lines = [line for line in text(snap).splitlines() if "fr_collective" in line and not line.startswith("#")]
    assert lines == [
        ('fr_collective_wait_seconds_total{pg_desc="default_pg",pg_name="0",rank="3"} 512.25 '
         '# {trace_id="8148d8a67990f3e495f51437477419ba"} 0.917 1699999990.5'),
        'fr_collectives_completed_total{pg_desc="default_pg",pg_name="0",rank="3"} 900.0']
    assert "fr_collective" not in text(Snapshot(snap.info, True, health=health))
