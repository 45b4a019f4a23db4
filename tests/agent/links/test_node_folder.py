"""The node folder lives under a guessable name in a folder anyone can write: it must be ours, private,
and its removal must never reach through a link."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest

dist = pytest.importorskip("torch.distributed", reason="a real TCPStore needs the torch extra")

from fr_otel.agent.links.channel import IncidentChannel
from fr_otel.agent.config import AgentConfig
from fr_otel.agent.links.node_channel import NodeChannel, node_folder
from fr_otel.agent.links.node_leader import node_role_for
from fr_otel.common.files import OutputRefused
from fr_otel.read.rank_process import RankProcess


def _base(shared: Path) -> Path:
    return shared / f"fr-otel-{os.getuid()}"


def test_a_link_planted_at_the_node_base_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    """``fr-otel-<uid>`` as a link to someone's folder: refused, the folder it points to stays empty."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    _base(tmp_path).symlink_to(theirs)
    with pytest.raises(OutputRefused, match="symbolic link"):
        node_folder(None, "job", "host-a", shared_root=tmp_path)
    assert list(theirs.iterdir()) == []


def test_a_node_base_others_may_enter_is_refused(tmp_path: Path) -> None:
    """A base made beforehand with mode 0o777 (by anyone, as ours): refused, not used."""
    _base(tmp_path).mkdir()
    os.chmod(_base(tmp_path), 0o777)
    with pytest.raises(OutputRefused, match="others may enter"):
        node_folder(None, "job", "host-a", shared_root=tmp_path)
    assert list(_base(tmp_path).iterdir()) == []


def test_node_folders_are_made_private_and_their_files_readable_by_this_user_only(tmp_path: Path) -> None:
    """Base, job, host and incident folders 0o700; board, heartbeats and payloads 0o600 (umask 0)."""
    old = os.umask(0)
    try:
        folder = node_folder(None, "job", "host-a", shared_root=tmp_path)
        channel = NodeChannel(folder, 3)
        channel.beat(1, 2)
        channel.drop_payload(5, b"payload")
    finally:
        os.umask(old)
    for path in (_base(tmp_path), _base(tmp_path) / "job", folder, folder / "i5"):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700, path
    for path in (folder / "hb.3", folder / "i5" / "rank_3.payload"):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600, path


def test_a_rank_whose_node_folder_is_a_link_goes_without_node_leaders(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A configured node folder that is a link: one log line, no node role (the rank talks to the store)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "nodes").symlink_to(elsewhere)
    config = AgentConfig(node_leaders="on", node_dir=str(tmp_path / "nodes"))
    channel = IncidentChannel(dist.HashStore(), "job")  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "fr_otel.agent"):
        role = node_role_for(config, channel, "job", 1, 8, RankProcess(host="host-a", pid=1, local_rank=1), 1,
                             {"LOCAL_WORLD_SIZE": "4"})
    assert role is None
    assert [r.getMessage() for r in caplog.records if "node leaders off" in r.getMessage()] != []
    assert list(elsewhere.iterdir()) == []


def test_removing_a_node_folder_never_follows_a_link_and_leaves_names_it_did_not_write(tmp_path: Path) -> None:
    """Links planted as ``board`` and ``i7`` go as links, their targets intact; a stranger's file stays."""
    folder = node_folder(None, "job", "host-a", shared_root=tmp_path)
    channel = NodeChannel(folder, 0)
    channel.beat(1)
    channel.drop_payload(2, b"mine")
    channel.drop_waits({"t": 1.0, "h": "host-a", "g": []})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "rank_0.payload").write_bytes(b"keep")
    (outside / "precious").write_bytes(b"keep")
    (folder / "i7").symlink_to(outside)
    (folder / "board").symlink_to(outside / "precious")
    (folder / "notes.txt").write_bytes(b"not ours")
    channel.remove()
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    assert (outside / "rank_0.payload").read_bytes() == b"keep"
    assert (outside / "precious").read_bytes() == b"keep"


def _folder_of(tmp_path: Path, environ: dict[str, str]) -> Path:
    config = AgentConfig(node_leaders="on", node_dir=str(tmp_path / "nodes"))
    role = node_role_for(config, IncidentChannel(dist.HashStore(), "job"), "job", 1, 8,  # type: ignore[arg-type]
                         RankProcess(host="host-a", pid=1, local_rank=1), 1, {"LOCAL_WORLD_SIZE": "4", **environ})
    assert role is not None
    return role.node.folder


def test_two_nodes_of_one_job_on_one_host_get_a_folder_each(tmp_path: Path) -> None:
    """torchrun --nnodes 2 twice on one machine (GROUP_RANK 0, 1), or Slurm's SLURM_NODEID: one folder, one
    leader, per node; ranks of the same node share theirs."""
    torchrun = [_folder_of(tmp_path, {"GROUP_RANK": g}) for g in ("0", "1", "1")]
    slurm = [_folder_of(tmp_path, {"SLURM_NODEID": n}) for n in ("0", "1")]
    assert torchrun[0] != torchrun[1] and torchrun[1] == torchrun[2]
    assert slurm[0] != slurm[1] and slurm[0] == torchrun[0]


def test_node_files_are_not_synced_to_disk_and_forgetting_an_incident_follows_no_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats, boards and payloads mean nothing after a crash: no fsync per rank per poll (where the folder
    is on a disk); other outputs still sync. Forgetting incident 3 takes its payloads, not incident 4's,
    and a link planted as ``i5`` goes as a link, its target intact."""
    from fr_otel.common.files import atomic_write

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    folder = node_folder(None, "job", "host-a", shared_root=tmp_path)
    channel = NodeChannel(folder, 0)
    channel.beat(1)
    channel.drop_payload(3, b"three")
    channel.drop_payload(4, b"four")
    assert synced == []
    atomic_write(tmp_path / "report.json", b"{}")
    assert len(synced) == 1
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "rank_0.payload").write_bytes(b"keep")
    (folder / "i5").symlink_to(outside)
    for k in (3, 5):
        channel.forget(k)
    assert sorted(p.name for p in folder.iterdir()) == ["hb.0", "i4"]
    assert (outside / "rank_0.payload").read_bytes() == b"keep"


NOBODY = 65534


@pytest.mark.parametrize("planted", ["base", "job", "node", "node-world-writable"])
def test_a_configured_node_folder_planted_by_another_user_at_any_level_is_refused(
        tmp_path: Path, planted: str, caplog: pytest.LogCaptureFixture) -> None:
    """FR_OTEL_NODE_DIR in a world-writable folder, where another user made the base, the job's or the node's
    folder beforehand (or made the node's world-writable, no sticky bit) and keeps a forged board in it: the
    rank goes without node leaders (one line naming the folder), the board is never read, nothing is written."""
    from fr_otel.agent.links.channel import job_digest

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    base = shared / "nodes"
    levels = {"base": base, "job": base / job_digest("job"), "node": base / job_digest("job") / "host-a"}
    levels["node-world-writable"] = levels["node"]
    target = levels[planted]
    target.mkdir(parents=True)
    (target / "board").write_text(json.dumps({"leader": 0, "pid": 1, "polled_ns": 2**62}))
    for level in (base, levels["job"], levels["node"]):
        if level.is_dir():
            os.chmod(level, 0o700)  # ours and private above the planted one: it alone is the problem
    if planted == "node-world-writable":
        os.chmod(target, 0o777)
    else:
        os.chown(target, NOBODY, NOBODY)
    before = sorted(p.name for p in target.iterdir())
    config = AgentConfig(node_leaders="on", node_dir=str(base))
    channel = IncidentChannel(dist.HashStore(), "job")  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "fr_otel.agent"):
        role = node_role_for(config, channel, "job", 1, 8, RankProcess(host="host-a", pid=1, local_rank=1), 1,
                             {"LOCAL_WORLD_SIZE": "4"})
    assert role is None
    lines = [r.getMessage() for r in caplog.records if "node leaders off" in r.getMessage()]
    assert len(lines) == 1 and str(target) in lines[0], lines
    assert ("owned by uid 65534" if planted != "node-world-writable" else "others may enter") in lines[0]
    assert sorted(p.name for p in target.iterdir()) == before


def test_a_node_folder_removed_under_the_job_is_made_again_only_inside_folders_of_ours(tmp_path: Path) -> None:
    """The job's folder gone (systemd's RemoveIPC) and another user's made in its place: the next heartbeat is
    refused there, not written into theirs; made again whole when the way is clear."""
    import shutil

    from fr_otel.agent.links.node_channel import NODE_LEVELS

    folder = node_folder(str(tmp_path / "nodes"), "job", "host-a")
    channel = NodeChannel(folder, 3, levels=NODE_LEVELS)
    shutil.rmtree(folder.parent)
    folder.parent.mkdir(mode=0o700)
    os.chown(folder.parent, NOBODY, NOBODY)
    with pytest.raises(OutputRefused, match="owned by uid 65534"):
        channel.beat(1, 2)
    assert list(folder.parent.iterdir()) == []
    shutil.rmtree(folder.parent)
    channel.beat(1, 2)
    assert (folder / "hb.3").is_file() and stat.S_IMODE(os.lstat(folder.parent).st_mode) == 0o700
