"""ranks.json is written by several writers into one folder: what one wrote is kept, and a link is never read."""

from __future__ import annotations

import json
from pathlib import Path

from fr_otel.read.rank_map import RANKS_FILE, read_host_map, write_host_map
from fr_otel.read.rank_process import RankProcess


def _process(host: str, pid: int) -> RankProcess:
    return RankProcess(host=host, pid=pid, source="agent")


def test_a_second_writer_keeps_the_ranks_the_first_one_wrote(tmp_path: Path) -> None:
    """node0 writes ranks 0-1, node1 ranks 2-3: the map holds all four."""
    write_host_map(tmp_path, {0: _process("node0", 10), 1: _process("node0", 11)}, 4)
    write_host_map(tmp_path, {2: _process("node1", 20), 3: _process("node1", 21)}, 4)
    found = read_host_map(str(tmp_path / RANKS_FILE), [])
    assert found is not None
    assert {r: p.host for r, p in found.processes.items()} == {0: "node0", 1: "node0", 2: "node1", 3: "node1"}


def test_a_link_planted_as_ranks_json_is_replaced_and_its_target_untouched(tmp_path: Path) -> None:
    """A link in ranks.json's place (to a file that is no map) is neither read nor written through."""
    target = tmp_path / "precious"
    target.write_text("precious\n")
    (tmp_path / RANKS_FILE).symlink_to(target)
    assert write_host_map(tmp_path, {0: _process("node0", 10)}, 1) == tmp_path / RANKS_FILE
    assert target.read_text() == "precious\n"
    assert not (tmp_path / RANKS_FILE).is_symlink()
    assert json.loads((tmp_path / RANKS_FILE).read_text())["ranks"]["0"]["host"] == "node0"
