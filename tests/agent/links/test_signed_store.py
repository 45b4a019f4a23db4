"""With the job's secret, the store carries only what the job signed: a planted verdict concludes nothing, forged
incidents spend none of the incident cap, and a forged host record names neither a process to read nor a host to
leave out. Every case runs on a real TCPStore on loopback, with the agent's own runners and a forger's client."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from support.node_ranks import flat_rank

from fr_otel.agent.incident.files import fetch_files_later
from fr_otel.agent.incident.part import read_host_ranks
from fr_otel.agent.incident.rank import dump_path
from fr_otel.agent.incident.runner import IncidentRunner
from fr_otel.agent.links.node_channel import Board, NodeChannel
from fr_otel.agent.links.signing import Seal, job_secret, new_secret
from fr_otel.agent.observe.poller import ProgressTracker
from fr_otel.agent.observe.proc_state import JOB_MARKERS, is_rank_process, stack_frames
from fr_otel.common.ids import trace_id_for
from fr_otel.incident.trigger import SeenStall, Trigger

WORLD = 4
SEAL = Seal(new_secret().encode(), "job")


class _Lines(logging.Handler):
    """The agent logger's warnings (its set-up stops propagation, so caplog does not see every one)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lines() -> Iterator[list[str]]:
    handler, agent_log = _Lines(), logging.getLogger("fr_otel.agent")
    agent_log.addHandler(handler)
    yield handler.lines
    agent_log.removeHandler(handler)


def _forger(port: int) -> Any:
    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    return dist.PrefixStore("fr_otel/job/", client)


def _plant(forger: Any, key: str, value: str | bytes) -> None:
    forger.set(key, value)
    assert forger.check([key])


def _runner(tmp_path: Path, port: int, rank: int, seal: Seal | None = SEAL, **config: Any) -> IncidentRunner:
    me = flat_rank(tmp_path / f"rank{rank}", port, rank, world=WORLD, seal=seal)
    recorder = pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []})
    me = dataclasses.replace(me, read_recorder=lambda: recorder,
                             config=dataclasses.replace(me.config, gather_seconds=3.0, **config))
    return IncidentRunner(me, ProgressTracker())


def _stall(seq: int) -> Trigger:
    return dataclasses.replace(Trigger.requested("test"), stall=SeenStall("0", seq))


def _unsigned_lines(lines: list[str], kind: str) -> list[str]:
    return [line for line in lines if f"{kind} record without this job's signature" in line]


def test_a_result_planted_before_any_incident_concludes_nothing_and_every_rank_joins_the_real_stall(
        tmp_path: Path, port: int, lines: list[str]) -> None:
    """``i/1..12/result = "{}"`` planted before anything goes wrong (unsigned, it reads as concluded: nobody would
    join). Rank 2 then raises incident 1 for a real stall: ranks 0, 1 and 3 join it, every rank's recorder is in
    its folder, the verdict read back is rank 2's own, and each rank says the planted results once."""
    forger = _forger(port)
    for k in range(1, 13):
        _plant(forger, f"i/{k}/result", "{}")
    unsigned = flat_rank(tmp_path / "plain", port, 0, world=WORLD).channel
    assert unsigned.concluded(1)  # what the job without a secret reads: the break this case holds
    runners = {r: _runner(tmp_path, port, r) for r in range(WORLD)}
    assert runners[2].raise_incident(_stall(7)) is not None and runners[2]._known == 1
    for r in (0, 1, 3):
        assert len(runners[r].join_open()) == 1 and runners[r]._taken == 1, r
    for runner in runners.values():
        assert runner.wait_idle(60)
    trace_hex = f"{trace_id_for('job', '1'):032x}"
    for r, runner in runners.items():
        assert dump_path(runner.me, trace_hex).is_file(), r
    result = runners[0].me.channel.result(1)
    assert result is not None and result != {} and result.get("trace_id") == trace_hex, result
    assert 1 <= len(_unsigned_lines(lines, "i/<n>/result")) <= WORLD
    for runner in runners.values():
        runner.stop(1)


def test_protocol_following_forged_incidents_spend_none_of_the_incident_cap(
        tmp_path: Path, port: int, lines: list[str]) -> None:
    """Ten incidents forged the protocol's way (the raiser's mark, then an owner record carrying its token), unsigned:
    with FR_OTEL_MAX_INCIDENTS=2 rank 1 joins none of them and takes part in none; rank 0's real stall is then
    incident 11, and rank 1 joins it. Each kind of unsigned record is said once per rank."""
    forger, now = _forger(port), time.time_ns()
    for k in range(1, 11):
        token = f"forged{k}"
        _plant(forger, f"i/{k}/by/0", token)
        _plant(forger, f"i/{k}/owner", json.dumps({"rank": 0, "reason": "stall", "pg_name": "0", "seq": 7,
                                                   "time_ns": now, "claim": token}))
    member = _runner(tmp_path, port, 1, max_incidents=2)
    assert member.join_open() == [] and member._taken == 0 and member._known == 10
    raiser = _runner(tmp_path, port, 0)
    assert raiser.raise_incident(_stall(7)) is not None and raiser._known == 11
    assert len(member.join_open()) == 1 and member._taken == 1 and member._known == 11
    assert len(_unsigned_lines(lines, "i/<n>/owner")) == 2  # rank 1 looking, rank 0 claiming: once each
    for runner in (member, raiser):
        runner.stop(1)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """Another process of this user, a secret token on its command line: what a forged host record points at."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--token=s3cr3t-token"],
                             env={"PATH": os.environ.get("PATH", "")})
    yield child
    child.kill()
    child.wait()


def test_a_forged_host_record_names_neither_a_process_to_read_nor_a_host_to_leave_out(
        tmp_path: Path, port: int, lines: list[str], bystander: subprocess.Popen[bytes]) -> None:
    """Rank 2 says where it runs; a forger then overwrites ``host/2`` with another process's pid and the name of a
    healthy host. Signed: rank 0's map has no rank 2 from it (the forgery said once). Unsigned (no secret): the
    forged record is in the map, but ``/proc`` of that process is not read (it is not proven to be rank 2), so
    nothing of it (state, command line) reaches an incident."""
    rank2 = _runner(tmp_path, port, 2)
    rank2.me.hosts.announce()
    forged = {"host": "gpu-healthy-07", "pid": bystander.pid, "local_rank": 2}
    _plant(_forger(port), "host/2", json.dumps(forged))
    rank0 = _runner(tmp_path, port, 0)
    rank0.me.hosts.gather([2])
    assert 2 not in rank0.me.hosts.processes
    assert len(_unsigned_lines(lines, "host/<n>")) == 1
    plain = _runner(tmp_path, port, 0, seal=None)
    plain.me.hosts.gather([2])
    assert plain.me.hosts.processes[2].pid == bystander.pid  # unsigned, the record itself is taken
    plain.me.hosts.processes[2] = dataclasses.replace(plain.me.hosts.processes[2], host=plain.me.process.host)
    facts = read_host_ranks(plain.me)
    assert 2 not in facts and all(f.pid != bystander.pid for f in facts.values()), facts
    for runner in (rank2, rank0, plain):
        runner.stop(1)


def test_a_process_is_proven_a_rank_only_by_its_rank_and_the_job_s_markers_in_its_environment(
        bystander: subprocess.Popen[bytes]) -> None:
    """A pid is read as rank 2's only when its environment says RANK=2 and carries the reader's values of the
    job's markers: a process without them, or of another job (another MASTER_PORT), is not; a pid no process has
    is (what is read of it: that it is gone); this very process is."""
    own = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29611", "TORCHELASTIC_RUN_ID": "run-a"}
    assert "MASTER_PORT" in JOB_MARKERS
    code = "import time; time.sleep(60)"
    env = {"PATH": os.environ.get("PATH", ""), "RANK": "2"}
    rank2 = subprocess.Popen([sys.executable, "-c", code], env={**env, **own})
    other_job = subprocess.Popen([sys.executable, "-c", code], env={**env, **own, "MASTER_PORT": "29612"})
    try:
        deadline = time.monotonic() + 10
        while b"RANK=2" not in Path(f"/proc/{rank2.pid}/environ").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert is_rank_process(rank2.pid, 2, own)
        assert not is_rank_process(rank2.pid, 3, own)
        assert not is_rank_process(other_job.pid, 2, own)
        assert not is_rank_process(bystander.pid, 2, own)
        assert is_rank_process(os.getpid(), 0, own)
    finally:
        for child in (rank2, other_job):
            child.kill()
            child.wait()
    assert is_rank_process(rank2.pid, 2, own)  # reaped: gone, and nothing of it to read


def test_a_py_spy_dump_keeps_its_frames_and_never_the_command_line() -> None:
    """py-spy's header names the process's whole command line (a token in it): only threads and frames are kept."""
    dump = ("Process 4242: python train.py --token=s3cr3t\nPython v3.11.9 (/usr/bin/python3.11)\n\n"
            "Thread 4242 (idle): \"MainThread\"\n    wait (threading.py:320)\n")
    kept = stack_frames(dump)
    assert "s3cr3t" not in kept and "Process" not in kept and "wait (threading.py:320)" in kept


def test_the_job_secret_comes_from_its_variable_or_its_file_and_a_short_or_missing_one_is_one_line(
        tmp_path: Path, lines: list[str]) -> None:
    """FR_OTEL_JOB_SECRET, else the file FR_OTEL_JOB_SECRET_FILE names (a regular file: a FIFO there blocks
    nothing); a secret too short or a file that cannot be read leaves the job unauthenticated, with one line."""
    secret = new_secret()
    assert job_secret({"FR_OTEL_JOB_SECRET": secret}) == secret.encode()
    (tmp_path / "secret").write_text(secret + "\n")
    assert job_secret({"FR_OTEL_JOB_SECRET_FILE": str(tmp_path / "secret")}) == secret.encode()
    os.mkfifo(tmp_path / "fifo")
    assert job_secret({"FR_OTEL_JOB_SECRET_FILE": str(tmp_path / "fifo")}) is None
    assert job_secret({"FR_OTEL_JOB_SECRET": "short"}) is None
    assert job_secret({}) is None
    assert len([line for line in lines if "unauthenticated" in line]) == 2


def test_a_signed_value_verifies_only_under_its_own_key_and_secret() -> None:
    """A signed value moved to another key, signed under another secret, altered, or unsigned does not verify."""
    blob = SEAL.sign("i/1/result", b'{"hang": true}')
    assert SEAL.open("i/1/result", blob) == b'{"hang": true}'
    assert SEAL.open("i/2/result", blob) is None
    assert Seal(new_secret().encode(), "job").open("i/1/result", blob) is None
    assert SEAL.open("i/1/result", blob[:-1] + b"}}") is None
    assert SEAL.open("i/1/result", b'{"hang": true}') is None


def test_a_node_folder_s_board_heartbeats_and_recorders_are_read_only_where_the_job_signed_them(
        tmp_path: Path, lines: list[str]) -> None:
    """A leader and a member of a signed node: the leader's board, the member's heartbeat and recorder are read
    back; a board, a heartbeat and a recorder written into the folder by anyone else (without the secret) are not,
    each kind said once; a file moved to another rank's name does not verify either."""
    leader, member = (NodeChannel(tmp_path / "node", r, world_size=WORLD, seal=SEAL) for r in (0, 1))
    now = time.time_ns()
    member.beat(now, 5)
    member.drop_payload(1, b"recorder of rank 1")
    leader.write_board(Board(0, os.getpid(), now, incidents=((1, {"rank": 0}),)))
    assert leader.beats() == {1: (now, 5)} and leader.payloads(1, [1]) == {1: b"recorder of rank 1"}
    board = member.board()
    assert board is not None and board.incidents == ((1, {"rank": 0}),)
    folder = tmp_path / "node"
    (folder / "hb.2").write_text(f"{now} 9")
    (folder / "hb.3").write_bytes((folder / "hb.1").read_bytes())  # rank 1's signed beat, as rank 3's
    (folder / "i1" / "rank_2.payload").write_bytes(b"forged recorder")
    assert leader.beats() == {1: (now, 5)} and leader.payloads(1, [1, 2]) == {1: b"recorder of rank 1"}
    forged = json.dumps(Board(0, 1, now, incidents=tuple((k, {"rank": 0}) for k in range(2, 12))).as_json())
    (folder / "board").write_text(forged)
    assert member.board() is None and member.board() is None
    said = [line for line in lines if "node folder" in line and "without this job's signature" in line]
    assert len(said) == 3, said  # hb.<n> (twice planted), i<n>/rank_<n>.payload, board: once each


def _fetched(me: Any, k: int, folder: Path, wait_s: float = 10) -> None:
    fetch_files_later(me, k, folder, wait_s)
    for thread in [t for t in threading.enumerate() if t.name == "fr-otel-files"]:
        thread.join(30)


def test_an_incident_s_files_from_the_store_are_checked_field_by_field_and_never_written_through_a_planted_link(
        tmp_path: Path, port: int, lines: list[str]) -> None:
    """Unsigned (anyone may write ``i/<k>/files``): an exclude list holding ``-x``, ``$(id)``, ``;touch`` or an ESC,
    or an incident.json that is no object, writes nothing; a planted ``<trace id>`` link is not written through;
    a file planted 0666 where a node writes its copy is replaced with this process's normal mode. Signed: a
    blob the coordinator did not sign is not fetched at all."""
    forger = _forger(port)
    me = flat_rank(tmp_path / "rank1", port, 1, world=WORLD)
    hostile = ["node-a\n-x\n", "node-a\n$(id)\n", "node-a\n;touch /tmp/p\n", "node-a\n\x1b[2Jnode-b\n"]
    for k, text in enumerate(hostile, start=1):
        _plant(forger, f"i/{k}/files", zlib.compress(json.dumps({"exclude-hosts.txt": text}).encode()))
        _fetched(me, k, tmp_path / f"i{k}")
        assert not (tmp_path / f"i{k}").exists(), text
    _plant(forger, "i/5/files", zlib.compress(json.dumps({"incident.json": "[]"}).encode()))
    _fetched(me, 5, tmp_path / "i5")
    assert not (tmp_path / "i5").exists()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "i6").symlink_to(target)
    good = {"exclude-hosts.txt": "node-a\n", "incident.json": json.dumps({"summary": {}})}
    _plant(forger, "i/6/files", zlib.compress(json.dumps(good).encode()))
    _fetched(me, 6, tmp_path / "i6")
    assert list(target.iterdir()) == []
    (tmp_path / "i7").mkdir()
    (tmp_path / "i7" / "exclude-hosts.txt").write_text("old\n")
    (tmp_path / "i7" / "exclude-hosts.txt").chmod(0o666)
    _plant(forger, "i/7/files", zlib.compress(json.dumps(good).encode()))
    _fetched(me, 7, tmp_path / "i7")
    written = tmp_path / "i7" / "exclude-hosts.txt"
    assert written.read_text() == "node-a\n" and written.stat().st_mode & 0o777 == 0o666 & ~_umask()
    signed = flat_rank(tmp_path / "rank2", port, 2, world=WORLD, seal=SEAL)
    _fetched(signed, 7, tmp_path / "i8", wait_s=1.5)
    assert not (tmp_path / "i8").exists() and _unsigned_lines(lines, "i/<n>/files")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
