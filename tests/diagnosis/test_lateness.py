"""The slow-rank rule: the ranks that wait least while their group waits long, and their hosts."""

from __future__ import annotations

import random
import re
from pathlib import Path

import yaml

from fr_otel.diagnosis.lateness import LATENESS_MIN, RankWait, holdups

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "fr-otel-rules.yml"
HOSTS = {0: "node0", 1: "node0", 2: "node1", 3: "node1", 4: "node2", 5: "node2"}


def _waits(shares: dict[int, float], per: dict[int, float] | None = None, completed: int = 50,
           group: str = "0") -> list[RankWait]:
    return [RankWait(r, HOSTS[r], group, "default_pg", s, (per or {}).get(r), completed) for r, s in shares.items()]


def test_a_throttled_host_is_named_with_its_ranks_and_the_waiting_ranks_are_not() -> None:
    """node1's ranks wait 2 % of their time, their four peers 92 %: node1 (ranks 2, 3), nobody else."""
    shares = {0: 0.92, 1: 0.91, 2: 0.02, 3: 0.03, 4: 0.92, 5: 0.93}
    per = {0: 0.55, 1: 0.54, 2: 0.01, 3: 0.02, 4: 0.56, 5: 0.55}
    (h,) = holdups(_waits(shares, per))
    assert (h.host, h.ranks, h.whole_host, h.pg_name) == ("node1", (2, 3), True, "0")
    assert round(h.lateness, 3) == round(0.915 - 0.03, 3) and h.share == 0.03 and h.median_share == 0.915
    assert (h.wait_s, h.peers_wait_s) == (0.02, 0.55)
    assert h.key == ("node1", "0")


def test_a_job_slowed_a_third_by_one_host_is_named() -> None:
    """1.3x: peers wait 25 % of their time (the third the host adds), the host 3 %."""
    (h,) = holdups(_waits({0: 0.25, 1: 0.26, 2: 0.03, 3: 0.04, 4: 0.24, 5: 0.25}))
    assert (h.host, h.ranks) == ("node1", (2, 3))


def test_a_throttled_host_whose_collectives_run_on_its_cpu_is_named_by_the_difference() -> None:
    """gloo in the lab: node1 at 5 % of a CPU is in flight 56-63 % of its time (its own part of each
    collective is slow too), its peers 83 %: the difference names it, nobody else."""
    (h,) = holdups(_waits({0: 0.82, 1: 0.85, 2: 0.63, 3: 0.56, 4: 0.83, 5: 0.84}))
    assert (h.host, h.ranks) == ("node1", (2, 3)) and round(h.lateness, 3) == 0.195


def test_a_slow_majority_is_the_norm_and_nobody_is_named() -> None:
    """Four of six ranks slow: the two fast ones wait, and waiting is never named."""
    assert holdups(_waits({0: 0.9, 1: 0.9, 2: 0.02, 3: 0.03, 4: 0.02, 5: 0.03})) == []


def test_one_slow_rank_on_a_host_is_named_alone_not_its_host() -> None:
    """Rank 5's data loader is slow, rank 4 on the same host waits like everyone: rank 5, not node2."""
    (h,) = holdups(_waits({0: 0.6, 1: 0.6, 2: 0.61, 3: 0.59, 4: 0.6, 5: 0.01}))
    assert (h.ranks, h.whole_host, h.key) == ((5,), False, ("rank 5", "0"))


def test_healthy_jitter_names_nobody() -> None:
    """A thousand healthy windows: everyone waits 5-60 % of the time, shares scattered by +-4 points, so
    lateness reaches 0.08 (healthy 3x2 lab jobs, 30 s windows: at most 0.061)."""
    rng = random.Random(7)
    for _ in range(1000):
        base = rng.uniform(0.05, 0.6)
        shares = {r: max(0.0, base + rng.uniform(-0.04, 0.04)) for r in HOSTS}
        assert holdups(_waits(shares)) == [], shares


def test_a_hang_is_not_slowness() -> None:
    """Nobody completed a collective in the window (rank 2 never arrived): the stall rules name it, not this."""
    assert holdups(_waits({0: 1.0, 1: 1.0, 2: 0.0, 3: 1.0, 4: 1.0, 5: 1.0}, completed=0)) == []


def test_each_group_is_judged_on_its_own_members() -> None:
    """A tensor-parallel pair on node1 waits alike (nobody late there); in the world group node1 is late."""
    waits = _waits({0: 0.9, 1: 0.9, 2: 0.02, 3: 0.02, 4: 0.9, 5: 0.9})
    waits += _waits({2: 0.1, 3: 0.11}, group="tp")
    assert [(h.pg_name, h.host) for h in holdups(waits)] == [("0", "node1")]


def test_the_thresholds_are_the_prometheus_rules_thresholds() -> None:
    """One rule in two languages: the agent's constants are the threshold:* rules the alerts compare with."""
    rules = {r["record"]: r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
             if "record" in r}
    value = {name: float(re.fullmatch(r"vector\(([\d.]+)\)", expr.strip()).group(1))  # type: ignore[union-attr]
             for name, expr in rules.items() if name.startswith("threshold:fr_slow_rank")}
    assert value == {"threshold:fr_slow_rank_lateness:ratio": LATENESS_MIN}
