"""The incident channel over a real TCPStore: fetching many payloads never waits on a missing one."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from support.stopwatch import Stopwatch

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from fr_otel.agent.links.channel import IncidentChannel
from fr_otel.common.ports import unused_tcp_port


def test_fetch_returns_every_payload_present_in_batches_and_skips_absent_ones_at_once() -> None:
    """600 ranks, 2 never published: fetch gives the 598 exact payloads, and absent keys cost no store timeout."""
    port = unused_tcp_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=3))
    channel = IncidentChannel(dist.PrefixStore("fr_otel/job/", client), "test")
    absent = {5, 599}  # batches of 256: the middle one is whole (multi_get), the others not
    for rank in range(600):
        if rank not in absent:
            channel.publish(1, rank, f"payload of rank {rank}".encode() * (rank % 7 + 1))
    assert channel.arrived(1) == 598
    watch = Stopwatch()
    got = channel.fetch(1, list(range(600)))
    assert watch.seconds() < 2.0  # a blocking get on an absent key would wait the 3 s timeout
    assert set(got) == set(range(600)) - absent
    assert all(got[r] == f"payload of rank {r}".encode() * (r % 7 + 1) for r in got)
    del server


def test_a_payload_names_every_member_of_a_16k_rank_world_in_a_few_bytes() -> None:
    """Members travel as runs: the world group of 16384 ranks costs bytes, not 100 KB, and decodes whole."""
    import pickle

    from fr_otel.agent.observe.payload import decode_payload, encode_payload
    from fr_otel.agent.observe.recorder import GroupInfo
    from fr_otel.read.rank_process import RankProcess

    world = tuple(range(16384))
    dp = tuple(range(5, 16384, 8))
    raw = pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []})
    groups = [GroupInfo("0", "default_pg", world, 0), GroupInfo("7", "dp", dp, 1)]
    assert len(encode_payload(raw, groups[:1], 64, 1, RankProcess(host="h", pid=1))) < 1024  # was ~40 KB
    payload = encode_payload(raw, groups, 64, 1, RankProcess(host="h", pid=1))
    dump = decode_payload(payload, 5, "rank 5", problems := [])
    assert dump is not None and not problems
    assert dump.pg_config["0"].ranks == world and dump.pg_config["7"].ranks == dp


def test_a_decoded_payload_gives_its_entries_on_demand_from_the_compressed_bytes(nvrx) -> None:
    """The coordinator keeps columns and tails; .entries re-reads the payload and equals a full parse of it."""
    import zlib

    from fr_otel.agent.observe.payload import _HEADER, decode_payload, encode_payload
    from fr_otel.agent.observe.recorder import GroupInfo
    from fr_otel.read.rank_process import RankProcess
    from fr_otel.read.dump_file import parse_dump_bytes

    raw = (nvrx / "lock_gil_1st" / "_dump_3").read_bytes()
    payload = encode_payload(raw, [GroupInfo("0", "default_pg", tuple(range(16)), 0)], 8, 7, RankProcess(pid=3))
    dump = decode_payload(payload, 3, "rank 3", [])
    assert dump is not None and dump._entries is None
    full = parse_dump_bytes(zlib.decompress(payload[_HEADER.size:]), 3, "rank 3", dumped_at_ns=7)
    assert full is not None and len(full.entries) > 8
    assert dump.entries == full.entries


def test_ranks_send_fewer_entries_per_group_as_the_world_grows_but_never_fewer_than_a_focused_trace_shows() -> None:
    """64 per group up to 4096 ranks, 16 at 16k and beyond, a smaller configured value always wins."""
    from fr_otel.agent.observe.payload import entries_per_group

    assert [entries_per_group(64, w) for w in (None, 8, 1024, 4096, 8192, 16384, 100_000)] == [64, 64, 64, 64, 32,
                                                                                              16, 16]
    assert entries_per_group(8, 16384) == 8
