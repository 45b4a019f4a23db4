"""Send/recv on a real Prometheus: the agent's p2p exposition, the rules, the alert and the panels.

Gloo records no send/recv, so no real CPU job can produce these series: the exposition here is
synthetic, but it is rendered by the agent's own collector (:class:`FrCollector`) from snapshots
of a 4-stage pipeline stall and served over HTTP by the agent's own server, and a real Prometheus
(Debian's 2.42) scrapes it with the shipped rules loaded. Stage 2 never posted its recv: rank 1
waits in its send to 2, rank 3 in its recv from 2, rank 0 in its backward recv from 1.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from support.operate import (
    CONTRACT_METRICS,
    RULES_FILE,
    alert_rules,
    iter_panels,
    load_dashboards,
    substitute,
    variable_values,
)

from fr_otel.agent.serve.metrics import FrCollector
from fr_otel.agent.serve.server import start_metrics_server
from fr_otel.agent.observe.state import GroupStatus, P2PWait, ProcessInfo, Snapshot
from support.prometheus import PrometheusServer, find_prometheus

PIPE = ("43", "PIPELINE_MODEL_PARALLEL_GROUP", (0, 1, 2, 3))
WAIT_S = 200  # past the default stall threshold (60 s) and as long again from the first scrape on
DASHBOARDS = load_dashboards()


def _snapshot(rank: int, started_ns: int) -> Snapshot:
    waits = {0: (P2PWait("recv", 1, started_ns),), 1: (P2PWait("send", 2, started_ns),), 2: (),
             3: (P2PWait("recv", 2, started_ns),)}[rank]
    groups = (
        GroupStatus("0", "default_pg", (0, 1, 2, 3), 0, 40, 40),
        GroupStatus(*PIPE, 1, 13698 + rank * 100, 13695 + rank * 100, has_p2p=True, p2p=waits),
    )
    return Snapshot(info=ProcessInfo(str(rank), str(rank), "node-a", "2.13.0", "nccl", "4", "2000"),
                    recorder_enabled=True, groups=groups)


@pytest.fixture(scope="module")
def prometheus() -> Iterator[PrometheusServer]:
    """Four ranks' /metrics (the agent's collector and server) scraped by a real Prometheus."""
    if find_prometheus() is None:
        pytest.fail("prometheus is not installed (scripts/setup-system.sh installs Debian's prometheus)")
    started = time.time_ns() - WAIT_S * 10**9
    servers = [start_metrics_server(FrCollector(lambda r=r: _snapshot(r, started)), 0, "127.0.0.1") for r in range(4)]
    assert all(servers)
    try:
        targets = [f"127.0.0.1:{s.port}" for s in servers if s is not None]
        with PrometheusServer(targets, job="fr-otel", labels={"training_job": "p2p-test"}, scrape_interval="1s",
                              rule_files=[RULES_FILE], startup_timeout=60) as server:
            try:
                # Every rank scraped (else a half-seen chain ends early), then the rules evaluated on it.
                server.wait_for("count(fr_info)", lambda r: bool(r) and r[0].value == 4, timeout=60)
                first = server.query("time()")[0].value
                server.wait_for("timestamp(peer_pg:fr_p2p_waited_on:age_seconds)",
                                lambda r: bool(r) and min(s.value for s in r) > first + 1, timeout=60)
            except TimeoutError as exc:
                pytest.fail(f"{exc}\ntargets: {server.targets_health()}\n{server.log_tail()}")
            yield server
    finally:
        for s in servers:
            if s is not None:
                s.stop()


def test_p2p_age_carries_the_peer_and_the_op(prometheus: PrometheusServer) -> None:
    """Each waiting rank's oldest send/recv per peer arrives with ``op`` and ``peer`` labels."""
    rows = prometheus.query('fr_inflight_p2p_age_seconds{pg_name="43"}')
    got = sorted((s.labels["rank"], s.labels["op"], s.labels["peer"]) for s in rows)
    contract = CONTRACT_METRICS["fr_inflight_p2p_age_seconds"] | {"__name__", "job", "instance", "training_job"}
    assert all(set(s.labels) <= contract for s in rows)
    assert got == [("0", "recv", "1"), ("1", "send", "2"), ("3", "recv", "2")]
    assert all(s.value >= WAIT_S for s in rows)


def test_recording_rule_and_alert_name_the_rank_the_chain_ends_on(prometheus: PrometheusServer) -> None:
    """Rank 2 (waited on, waiting on no one) is named; rank 1 (waited on by 0, itself waiting) is not."""
    ended = prometheus.query("peer_pg:fr_p2p_waited_on:age_seconds")
    assert [(s.labels["peer"], s.labels["pg_name"], s.labels["training_job"]) for s in ended] == [("2", "43", "p2p-test")]
    (rule,) = [r for r in alert_rules() if r["alert"] == "FrOtelSendRecvStalled"]
    firing = prometheus.query(rule["expr"])
    assert [s.labels["peer"] for s in firing] == ["2"] and firing[0].value >= WAIT_S


def test_per_rank_p2p_counters_are_never_compared_across_ranks(prometheus: PrometheusServer) -> None:
    """The pipeline group's counters differ per rank (13695 vs 13995) and are not exposed, so the
    collective lag rules blame no one for them."""
    assert prometheus.query('fr_last_enqueued_seq{pg_name="43"}') == []
    assert prometheus.query('rank_pg:fr_last_enqueued_seq:lag{pg_name="43"}') == []
    assert prometheus.query("rank_pg:fr_behind:lag") == []
    assert len(prometheus.query('fr_last_enqueued_seq{pg_name="0"}')) == 4  # collectives still are


def _panel_exprs(dashboard: str, title: str, rank: str) -> list[str]:
    """The panel's queries, with the dashboard's variables substituted as Grafana would."""
    dash = DASHBOARDS[dashboard]
    (panel,) = [p for p in iter_panels(dash["panels"]) if p.get("title") == title]
    values = variable_values(dash, {"rank": rank})
    return [substitute(t["expr"], values) for t in panel["targets"]]


def test_dashboard_panels_show_the_wait(prometheus: PrometheusServer) -> None:
    """Overview: rank 2 is the end of the chain; rank drill-down: rank 1's send to peer 2."""
    overview = _panel_exprs("fr-otel-overview.json", "Waited on in send/recv", "0")
    waited = {s.labels["peer"]: s.value for s in prometheus.query(overview[0])}
    assert set(waited) == {"1", "2"} and min(waited.values()) >= WAIT_S
    ends = {s.labels["peer"]: s.value for s in prometheus.query(overview[1])}
    assert ends == {"2": 1.0}
    (rank_expr,) = _panel_exprs("fr-otel-rank.json", "Pending send/recv of rank $rank, by peer", "1")
    assert [(s.labels["op"], s.labels["peer"]) for s in prometheus.query(rank_expr)] == [("send", "2")]
