"""The demo's reading of the ranks' /metrics names the same ranks as the PromQL it prints, run in a
real Prometheus over the same endpoints: the culprit query and the shipped recording rule."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fr_otel.common.promql import BLAME_RULE, culprit_query
from fr_otel.demo.scrape import scrape
from support.prometheus import PrometheusServer, find_prometheus

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "fr-otel-rules.yml"
THRESHOLD_S = 5.0
#: pg_name -> (each rank's last enqueued seq, each rank's oldest in-flight age): one situation per group.
GROUPS = {
    "stalled": ([6, 6, 5, 6], [12.0, 12.0, 0.0, 12.0]),  # rank 2 never enqueued #6: the others wait on it
    "level": ([9, 9, 9, 9], [12.0, 12.0, 12.0, 12.0]),  # everyone inside the same collective: nobody behind
    "young": ([3, 4, 4, 4], [0.0, 3.0, 3.0, 3.0]),  # rank 0 behind, but the wait is under the threshold
    "two": ([7, 7, 8, 8], [0.0, 0.0, 15.0, 15.0]),  # ranks 0 and 1 both behind
}
EXPECTED = {"stalled": (2,), "level": (), "young": (), "two": (0, 1)}


def exposition(rank: int) -> bytes:
    """One rank's /metrics text for every situation, as the agent's collector names and labels it."""
    lines = ["# TYPE fr_last_enqueued_seq gauge", "# TYPE fr_inflight_collective_age_seconds gauge"]
    for pg, (seqs, ages) in GROUPS.items():
        labels = f'pg_desc="{pg}_desc",pg_name="{pg}",rank="{rank}"'
        op = "all_reduce" if ages[rank] else ""
        lines.append(f"fr_last_enqueued_seq{{{labels}}} {seqs[rank]}")
        lines.append(f'fr_inflight_collective_age_seconds{{op="{op}",{labels}}} {ages[rank]}')
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def endpoints() -> Iterator[dict[int, str]]:
    """Four real HTTP endpoints on loopback, rank r serving rank r's exposition at /metrics."""
    servers = []
    for rank in range(4):
        body = exposition(rank)

        class Handler(http.server.BaseHTTPRequestHandler):
            payload = body

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(self.payload)

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield {r: f"http://127.0.0.1:{s.server_address[1]}/metrics" for r, s in enumerate(servers)}
    for s in servers:
        s.shutdown()
        s.server_close()


def test_the_scrape_blames_each_situation_as_the_culprit_query_states(endpoints: dict[int, str]) -> None:
    """Read with prometheus_client's parser: the lowest rank(s) of a group that disagrees and waits past
    the threshold, nobody in a level group or a young wait; every rank's series is there."""
    scraped = scrape(endpoints)
    assert scraped.failed == {}
    blamed = {g.pg_name: g.culprits for g in scraped.blame(THRESHOLD_S)}
    assert blamed == EXPECTED
    stalled = next(g for g in scraped.blame(THRESHOLD_S) if g.pg_name == "stalled")
    assert (stalled.pg_desc, stalled.op, stalled.oldest_age_s, stalled.enqueued) == (
        "stalled_desc", "all_reduce", 12.0, {0: 6, 1: 6, 2: 5, 3: 6})
    assert [s.text() for s in scraped.of_group("stalled")][2] == (
        'fr_last_enqueued_seq{pg_desc="stalled_desc",pg_name="stalled",rank="2"} 5')


def test_a_rank_that_does_not_answer_is_named_not_raised(endpoints: dict[int, str]) -> None:
    """A /metrics that refuses the connection costs one entry in ``failed``; the others are still read."""
    from fr_otel.common.ports import unused_tcp_port

    urls = {**endpoints, 3: f"http://127.0.0.1:{unused_tcp_port()}/metrics"}
    scraped = scrape(urls, timeout_s=1.0)
    assert list(scraped.failed) == [3] and scraped.failed[3]
    assert sorted(scraped.by_rank("fr_last_enqueued_seq")) == [0, 1, 2]


@pytest.mark.skipif(find_prometheus() is None, reason="needs Debian's prometheus binary")
def test_prometheus_names_the_same_ranks_with_the_printed_query_and_the_shipped_rule(
        endpoints: dict[int, str]) -> None:
    """The query the demo prints (at its threshold) and ``rank_pg:fr_behind:lag`` from the shipped rules
    (blame floor 10 s), evaluated by a real Prometheus scraping the same endpoints, blame what the
    demo's own reading blames."""
    targets = [u.removeprefix("http://").removesuffix("/metrics") for u in endpoints.values()]
    with PrometheusServer(targets, scrape_interval="1s", rule_files=[RULES]) as prom:
        prom.wait_for_targets(up=4, timeout=30)

        def by_group(rows: list) -> dict[str, tuple[int, ...]]:
            out: dict[str, list[int]] = {pg: [] for pg in GROUPS}
            for row in rows:
                out[row.labels["pg_name"]].append(int(row.labels["rank"]))
            return {pg: tuple(sorted(ranks)) for pg, ranks in out.items()}

        queried = prom.wait_for(culprit_query(THRESHOLD_S), lambda rows: by_group(rows) == EXPECTED, timeout=30)
        assert by_group(queried) == EXPECTED
        ruled = prom.wait_for(BLAME_RULE, lambda rows: by_group(rows) == EXPECTED, timeout=30)
        assert by_group(ruled) == EXPECTED
