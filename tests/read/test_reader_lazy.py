"""Dumps held in memory (agent payloads) can be read as columns only, with entries on demand."""

from __future__ import annotations

from pathlib import Path

from fr_otel.read.pg_meta import parse_ranks
from fr_otel.read.dump_file import parse_dump_bytes, read_dump_file


def test_a_dump_from_bytes_read_without_entries_gives_the_same_dump_and_its_entries_on_demand(nvrx: Path) -> None:
    """full=False keeps columns and tails; .entries then re-parses the bytes and equals a full parse."""
    path = nvrx / "lock_gil_1st" / "_dump_3"
    data = path.read_bytes()
    full = parse_dump_bytes(data, 3, "x", dumped_at_ns=5)
    lazy = parse_dump_bytes(data, 3, "x", dumped_at_ns=5, full=False)
    assert full is not None and lazy is not None
    assert lazy._entries is None
    assert (lazy.histories, lazy.tail, lazy.pg_config, lazy.pg_status) == (full.histories, full.tail, full.pg_config,
                                                                            full.pg_status)
    assert lazy.entries == full.entries == read_dump_file(str(path), 3, []).entries


def test_member_lists_parse_alike_every_time_and_bad_ones_stay_refused() -> None:
    """The per-process memo of member lists returns what a fresh parse would, for good and bad text."""
    big = str(list(range(16384)))
    assert parse_ranks(big) == parse_ranks(big) == tuple(range(16384))
    assert parse_ranks("[3, 1, 1]") == parse_ranks(" [3, 1, 1] ") == (1, 3)
    for bad in ("[1, -2]", "[a]", "1, 2", "[1,,2]"):
        assert parse_ranks(bad) is None and parse_ranks(bad) is None
    assert parse_ranks("[]") == ()


def test_member_lists_written_as_runs_read_as_the_full_sets_and_absurd_runs_are_refused() -> None:
    """"[0-3, 8, 10-11]" (the agent's payloads) is the ranks it names; a descending or 10**12-long run is None."""
    assert parse_ranks("[0-3, 8, 10-11]") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_ranks("[0-16383]") == tuple(range(16384))
    for bad in ("[5-3]", "[0-1000000000000]", "[-3]", "[1-]", "[-]", "[1-2-3]"):
        assert parse_ranks(bad) is None, bad
