"""A rank's last record on its node: kept on change, vouched for otherwise, read back like a dump, refused when
forged, another process's, dated ahead or stale, loaded by an incident for a silent rank of the coordinator's node,
and sent whole by a node leader for its own silent ranks."""

from __future__ import annotations

import os
import pickle
import stat
import time
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
from support.node_ranks import flat_rank

from fr_otel.agent.incident.gather import add_last_records
from fr_otel.agent.incident.relay import silent_records, summarise_node
from fr_otel.agent.links.node_channel import NodeChannel
from fr_otel.agent.observe.last_record import (
    MAX_RECORD_BYTES,
    STALE_RECORD_POLLS,
    RecordKeeper,
    encode_record,
    load_record,
)
from fr_otel.agent.observe.payload import decode_payload, frame_payload
from fr_otel.agent.observe.recorder import Counters, GroupInfo
from fr_otel.read.dump_file import parse_dump_bytes
from fr_otel.read.node_summary import decode_node_summary
from fr_otel.read.rank_process import RankProcess
from fr_otel.read.reader import ReadResult
from fr_otel.read.steps import StepLog

GROUPS = (GroupInfo("0", "default_pg", (0, 1, 2, 3), 0),)
PROCESS = RankProcess(host="node0", pid=4242, local_rank=2, source="agent")
POLL = 0.5


def _counters(enqueued: int) -> dict[int, Counters]:
    return {0: Counters(enqueued, -1, enqueued)}


def _keeper(tmp_path: Path, rank: int = 2, pid: int = 4242) -> RecordKeeper:
    return RecordKeeper(NodeChannel(tmp_path / "node", rank), replace(PROCESS, pid=pid), pid)


def _load(data: bytes, file_ns: int, *, pid: int | None = 4242, heard_ns: int | None = None,
          now_ns: int | None = None) -> object:
    now = now_ns or time.time_ns()
    return load_record(data, file_ns, 2, pid=pid, heard_ns=heard_ns, now_ns=now, poll_interval=POLL, source="rank 2")


def test_a_record_is_written_on_change_and_only_vouched_for_while_the_state_holds(tmp_path: Path) -> None:
    """The same state twice: one write, then the file's time moves (no second write); a new state: a new write."""
    keeper = _keeper(tmp_path)
    keeper.keep("2.10", _counters(5), GROUPS, StepLog(3, ((3, 1),), "optimizer"), time.time_ns())
    path = tmp_path / "node" / "last.2"
    first = path.read_bytes()
    mtime = path.stat().st_mtime_ns
    time.sleep(0.02)
    keeper.keep("2.10", _counters(5), GROUPS, StepLog(3, ((3, 1),), "optimizer"), time.time_ns())
    assert (keeper.writes, keeper.vouches) == (1, 1) and path.read_bytes() == first
    assert path.stat().st_mtime_ns > mtime
    keeper.keep("2.10", _counters(6), GROUPS, None, time.time_ns())
    assert keeper.writes == 2 and path.read_bytes() != first
    assert keeper.bytes_written == len(first) + len(path.read_bytes()) and len(first) < 2048
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE((tmp_path / "node").stat().st_mode) == 0o700


def test_a_rank_leaving_removes_its_record_and_the_emptied_node_folder(tmp_path: Path) -> None:
    """Its way out: the record goes, the folder too once empty; a poll under way writes nothing after that."""
    keeper = _keeper(tmp_path)
    keeper.keep("2.10", _counters(5), GROUPS, None, time.time_ns())
    keeper.drop()
    keeper.keep("2.10", _counters(6), GROUPS, None, time.time_ns())
    assert not (tmp_path / "node").exists()


def test_a_failed_write_leaves_no_older_record_behind(tmp_path: Path) -> None:
    """A write refused (a link planted at the folder's place) raises for the guard, and no stale copy outlives it."""
    keeper = _keeper(tmp_path)
    keeper.keep("2.10", _counters(5), GROUPS, None, time.time_ns())
    os.rename(tmp_path / "node", tmp_path / "moved")
    os.symlink(tmp_path / "moved", tmp_path / "node")
    with pytest.raises(OSError):
        keeper.keep("2.10", _counters(6), GROUPS, None, time.time_ns())
    assert not (tmp_path / "moved" / "last.2").exists()


def test_a_kept_record_reads_back_as_the_ranks_dump_with_its_times(tmp_path: Path) -> None:
    """Counters, groups, step and process come back; its record says when taken, vouched for, silent and loaded;
    the bytes for the incident's folder parse to the same."""
    keeper = _keeper(tmp_path)
    taken = time.time_ns()
    keeper.keep("2.10", _counters(7), GROUPS, StepLog(3, ((3, taken - 10**9),), "optimizer"), taken)
    found = NodeChannel(tmp_path / "node", 0).record_of(2, MAX_RECORD_BYTES)
    assert found is not None
    heard = taken + 10**8
    got = _load(found[0], found[1], heard_ns=heard, now_ns=heard + 4 * 10**9)
    assert not isinstance(got, str), got
    dump, kept = got  # type: ignore[misc]
    assert dump.pg_status[0].enqueued == 7 and dump.pg_config["0"].ranks == (0, 1, 2, 3)
    assert dump.process.pid == 4242 and dump.steps.step == 3 and not dump.entries
    record = dump.record
    assert record.taken_ns == taken and record.silent_since_ns == heard and record.confirmed_ns == found[1]
    assert record.age_s == pytest.approx((heard + 4 * 10**9 - record.as_of_ns) / 1e9)
    assert "its last record, 4.1 s old" in record.said() or "its last record, 4.0 s old" in record.said()
    again = parse_dump_bytes(kept, 2, "folder")
    assert again is not None and again.record == record and again.pg_status[0].enqueued == 7


def _forged(body: dict[str, object] | bytes, stamp: int) -> bytes:
    return frame_payload(body if isinstance(body, bytes) else pickle.dumps(body, protocol=4), stamp)


@pytest.mark.parametrize(("make", "why"), [
    (lambda t: b"not a payload at all", "unreadable"),
    (lambda t: b"FRO1" + t.to_bytes(8, "big") + b"\x00corrupt", "unreadable"),
    (lambda t: b"FRO1" + t.to_bytes(8, "big") + zlib.compress(b"\x00" * (8 << 20)), "unreadable (over"),
    (lambda t: _forged(b"cos\nsystem\n(S'true'\ntR.", t), "unreadable"),
    (lambda t: _forged({"version": "2.10", "pg_status": {}, "entries": []}, t), "not a last record fr-otel wrote"),
    (lambda t: _forged({"version": "2.10", "entries": [], "fr_otel_last_record": {"taken_ns": t + 1}}, t),
     "not a last record fr-otel wrote"),
    (lambda t: _forged({"version": "2.10", "entries": [], "fr_otel_last_record": {"taken_ns": t + 10**11}},
                       t + 10**11), "dated ahead"),
    (lambda t: _forged({"version": "2.10", "entries": [], "fr_otel_last_record": {"taken_ns": t, "pid": 99}}, t),
     "written by process 99, not the rank's process 4242"),
    (lambda t: _forged({"version": "2.10", "entries": "no list", "pg_status": 7,
                        "fr_otel_last_record": {"taken_ns": t, "pid": 4242}}, t), "not a recorder's state"),
])
def test_a_forged_or_foreign_record_is_refused_with_its_reason(make: object, why: str) -> None:
    """Bytes that are no payload, a bomb, a pickle with a global, no stamp or one unlike the frame's, a date ahead,
    another process's record, a body no dump reader takes: each one line, never a dump."""
    stamp = time.time_ns() - 10**9
    got = _load(make(stamp), stamp)  # type: ignore[operator]
    assert isinstance(got, str) and got.startswith(why), got


def test_a_record_its_agent_stopped_vouching_for_is_stale(tmp_path: Path) -> None:
    """The rank beat on for polls after its agent last vouched for the record: stale, said with how much."""
    keeper = _keeper(tmp_path)
    taken = time.time_ns() - 10 * 10**9
    keeper.keep("2.10", _counters(7), GROUPS, None, taken)
    data = (tmp_path / "node" / "last.2").read_bytes()
    late = taken + int((STALE_RECORD_POLLS + 1) * POLL * 1e9)
    got = _load(data, taken, heard_ns=late)
    assert isinstance(got, str) and got.startswith("stale: its agent last vouched for it 2.0 s before"), got
    assert not isinstance(_load(data, taken, heard_ns=taken + int(POLL * 1e9)), str)


def test_the_node_folder_gives_no_record_through_a_link_a_fifo_or_past_its_bound(tmp_path: Path) -> None:
    """A planted link, a FIFO or an oversized file at a record's name reads as no record at all."""
    node = tmp_path / "node"
    node.mkdir(mode=0o700)
    (tmp_path / "real").write_bytes(b"x")
    os.symlink(tmp_path / "real", node / "last.1")
    os.mkfifo(node / "last.2")
    (node / "last.3").write_bytes(b"x" * (MAX_RECORD_BYTES + 1))
    channel = NodeChannel(node, 0)
    assert [channel.record_of(r, MAX_RECORD_BYTES) for r in (1, 2, 3, 4)] == [None] * 4


def test_an_incident_loads_the_records_of_its_nodes_silent_ranks_and_says_why_where_it_cannot(
        tmp_path: Path, port: int) -> None:
    """Rank 1's record is loaded (and kept in the incident's folder), rank 2's is another process's, rank 3
    crashed before its first poll: one line each, and only rank 1 becomes a dump."""
    me = replace(flat_rank(tmp_path, port, 0), records=NodeChannel(tmp_path / "node", 0))
    now = time.time_ns()
    for rank in (1, 2, 3):
        me.hosts.processes[rank] = RankProcess(host="node0", pid=100 + rank, local_rank=rank, source="agent")
        me.channel.note_beat(rank, now, None)
    _keeper(tmp_path, 1, pid=101).keep("2.10", _counters(7), GROUPS, None, now)
    _keeper(tmp_path, 2, pid=999).keep("2.10", _counters(7), GROUPS, None, now)
    read = ReadResult(problems=[])
    add_last_records(me, read, [1, 2, 3], tmp_path / "incident")
    assert sorted(read.dumps) == [1] and read.dumps[1].record is not None
    assert (tmp_path / "incident" / "fr_trace_rank_1").is_file()
    assert read.problems[0].startswith("rank 1 sent nothing: its state is its last record, ")
    assert read.problems[1] == ("rank 2's last record on its node is not used: written by process 999, not the "
                                "rank's process 102 (an earlier run's)")
    assert read.problems[2].startswith("rank 3 left no last record on its node (it stopped before its agent's first")


def test_a_node_leader_sends_its_silent_ranks_records_whole_in_its_summary(tmp_path: Path) -> None:
    """Ranks 1-3 stopped beating: rank 1's record goes in the node's summary and decodes to its dump there; rank 2's
    is stale (it beat on for seconds after its agent last vouched for it) and rank 3 left none: one line each."""
    node = NodeChannel(tmp_path / "node", 0)
    now = time.time_ns()
    _keeper(tmp_path, 1, pid=101).keep("2.10", _counters(7), GROUPS, None, now - 10**8)
    _keeper(tmp_path, 2, pid=102).keep("2.10", _counters(7), GROUPS, None, now - 10 * 10**9)
    os.utime(tmp_path / "node" / "last.2", ns=(now - 10 * 10**9,) * 2)
    for rank in (1, 2, 3):
        NodeChannel(tmp_path / "node", rank).beat(now)
    problems: list[str] = []
    records = silent_records(node, node.heard(), [0], POLL, problems)
    assert sorted(records) == [1]
    assert problems[0].startswith("rank 2's last record on its node is not used: stale: its agent last vouched for it")
    assert problems[1].startswith("rank 3 left no last record on its node")
    blob, ranks, _ = summarise_node("node-a", 0, {}, node.heard(), problems, records)
    summary = decode_node_summary(blob, "node summary 1", problems, {})
    assert summary is not None and ranks == () and sorted(summary.full) == [1]
    dump = decode_payload(summary.full[1], 1, "rank 1 (from its node)", problems)
    assert dump is not None and dump.record is not None and dump.pg_status[0].enqueued == 7
    assert dump.record.silent_since_ns == summary.heard[1] and dump.record.loaded_ns is not None
