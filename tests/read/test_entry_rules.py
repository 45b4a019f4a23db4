"""What a recorder entry means is decided once (read/entry_rules): the dump reader and the live agent agree."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from fr_otel import read_dumps
from fr_otel.agent.observe.recorder import scan_entries, scan_p2p
from fr_otel.testing.dump_builder import DumpBuilder


def _two_collectives(backend: str, tmp_path: Path, *, state: str, retired: bool) -> tuple[Path, list[dict]]:
    """Rank 0's dump of two collectives, the second's state/retired set as given; its path and raw entries."""
    b = DumpBuilder(2, backend=backend)
    b.collective(b.world)
    b.collective(b.world)
    raw = pickle.loads(b.dump(0))
    raw["entries"][1]["state"], raw["entries"][1]["retired"] = state, retired
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(raw))
    return path, raw["entries"]


@pytest.mark.parametrize(("backend", "state", "retired", "done"), [
    ("gloo", "completed", False, False),  # gloo's progress is `retired`; its state says nothing
    ("gloo", "scheduled", True, True),
    ("nccl", "completed", False, True),  # NCCL's is `state`
    ("nccl", "scheduled", True, False),
])
def test_the_reader_and_the_agent_agree_whether_an_entry_completed(tmp_path: Path, backend: str, state: str,
                                                                  retired: bool, done: bool) -> None:
    """The same entry is completed (or not) for the dump reader's verdict and the agent's in-flight scan."""
    path, entries = _two_collectives(backend, tmp_path, state=state, retired=retired)
    dump = read_dumps(str(path)).dumps[0]
    second = dump.entries[1]
    assert second.completed is done
    pending, finished, _ = scan_entries(entries)
    slot = entries[1]["pg_id"]
    assert (slot not in pending and finished.get(slot) == second.collective_seq_id) is done


def test_the_agent_reads_a_send_recv_name_by_the_readers_rule() -> None:
    """`nccl:send 1->2` and `nccl:recv 2<-?`: the agent's pending send/recv per peer come from read's p2p_name."""
    def entry(name: str, record: int) -> dict:
        return {"record_id": record, "pg_id": 3, "process_group": ("3", "pp"), "collective_seq_id": 0,
                "profiling_name": name, "is_p2p": True, "state": "scheduled", "retired": False,
                "time_created_ns": 1_000 + record}
    found = scan_p2p([entry("nccl:send 1->2", 0), entry("nccl:send 1->2", 1), entry("nccl:recv 2<-?", 2),
                      entry("nccl:send 1=>2", 3)])
    assert sorted((p.op, str(p.peer_local), p.created_ns) for p in found[3]) == [("recv", "None", 1_002),
                                                                              ("send", "2", 1_000)]
