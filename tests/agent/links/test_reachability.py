"""Probing the other hosts by the address they published, and saying which hosts could not be probed."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from fr_otel.agent.links.reachability import NOT_RESOLVED, local_address, network_facts, reachable_at
from fr_otel.read.network import network_from_raw
from fr_otel.read.rank_map import read_host_map, write_host_map
from fr_otel.read.rank_process import RankProcess

UNRESOLVABLE = "node-that-does-not-resolve.invalid"  # .invalid never resolves (RFC 6761)


def test_a_host_whose_name_does_not_resolve_is_probed_at_the_address_it_published() -> None:
    """nodeB's name resolves nowhere, but its rank published 127.0.0.1 and a listening port: it is probed there and
    answers; nodeC published nothing and its name does not resolve: "not probed", never "did not answer"."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        processes = {0: RankProcess(host="nodeA", local_rank=0),
                     2: RankProcess(host=UNRESOLVABLE, local_rank=0, ip="127.0.0.1", metrics_port=port),
                     4: RankProcess(host="nodeC.invalid", local_rank=0)}
        facts = network_facts("nodeA", processes, 9, "127.0.0.1:29500", None, None, {UNRESOLVABLE, "nodeC.invalid"})
    assert facts is not None
    assert facts.answered == {UNRESOLVABLE: True}
    assert facts.probed == {UNRESOLVABLE: f"127.0.0.1:{port}"}
    assert facts.not_probed == {"nodeC.invalid": NOT_RESOLVED}
    again = network_from_raw(json.loads(json.dumps(facts.as_json())))
    assert again == facts  # incident.json keeps which address was probed, and which host was not


def test_a_published_address_that_does_not_answer_is_no_answer() -> None:
    """A closed port at the published address: probed, did not answer (and the address is said)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    facts = network_facts("nodeA", {2: RankProcess(host="nodeB", ip="127.0.0.1", metrics_port=port)}, None,
                          "127.0.0.1:1", None, None, {"nodeB"})
    assert facts is not None and facts.answered == {"nodeB": False} and facts.probed == {"nodeB": f"127.0.0.1:{port}"}


def test_a_rank_publishes_the_local_end_of_its_route_to_the_store_and_its_metrics_port() -> None:
    """The address peers reach this host at is the source address of its route to the store; a /metrics served
    on every interface publishes that address and its port, one served on loopback only publishes no port."""
    assert local_address("127.0.0.1:29500") == "127.0.0.1"
    assert local_address(f"{UNRESOLVABLE}:29500") is None and local_address("") is None
    me = RankProcess(host="nodeA", pid=7, local_rank=1)
    assert reachable_at(me, "127.0.0.1:29500", ("0.0.0.0", 9401)) == RankProcess(
        host="nodeA", pid=7, local_rank=1, ip="127.0.0.1", metrics_port=9401)
    assert reachable_at(me, "127.0.0.1:29500", ("127.0.0.1", 9401)).metrics_port is None
    assert reachable_at(me, "127.0.0.1:29500", None).probe_at is None


def test_ranks_json_keeps_each_ranks_address_and_port_and_drops_ones_that_are_not_addresses(tmp_path: Path) -> None:
    """The host map written at start-up carries where each rank is probed; a planted value that is no IP address
    (a name, a command) or no port is read as unknown."""
    write_host_map(tmp_path, {0: RankProcess(host="node0", ip="10.213.0.1", metrics_port=9400)}, 2)
    doc = json.loads((tmp_path / "ranks.json").read_text())
    assert doc["ranks"]["0"]["address"] == "10.213.0.1" and doc["ranks"]["0"]["metrics_port"] == 9400
    doc["ranks"]["1"] = {"host": "node1", "address": "node1; touch /tmp/x", "metrics_port": 70000}
    (tmp_path / "ranks.json").write_text(json.dumps(doc))
    host_map = read_host_map(str(tmp_path / "ranks.json"), [])
    assert host_map is not None
    assert host_map.processes[0].probe_at == ("10.213.0.1", 9400)
    assert (host_map.processes[1].ip, host_map.processes[1].metrics_port) == (None, None)
