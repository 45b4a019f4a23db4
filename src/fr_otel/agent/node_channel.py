"""The node-local channel between a node's leader and its other ranks: small files on the node's own disk.

A node leader (:mod:`.node_leader`) talks to the job's store for its whole node; its ranks talk
only to it, through a folder on the node (``/dev/shm`` by default: memory, never a network file
system, so no call here can block on anything but the local kernel):

- ``board``: written by the leader on every poll: who leads (rank, pid), when it last polled
  (wall clock), the incidents it knows of, and for each which ranks' recorders it has sent on;
- ``hb.<rank>``: each rank's heartbeat (the wall clock of its last poll and its training step then),
  which the leader sends on in one heartbeat for the node;
- ``i<k>/rank_<r>.payload``: a rank's recorder for incident k, for the leader to summarise.

Files, not sockets: a leader that dies or freezes leaves a board that simply stops changing, and
its ranks notice within a few polls (:meth:`NodeChannel.board`) and go back to the job's store
themselves. Every write is atomic (write, then rename), so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.files import atomic_write
from ..common.json_types import is_exact_int
from .channel import beat_text, parse_beat

__all__ = ["STALE_POLLS", "Board", "NodeChannel", "node_folder"]

#: A board (or a rank's heartbeat) this many polls old: its writer is presumed lost.
STALE_POLLS = 3
_MAX_BOARD_BYTES = 1 << 20
_MAX_PAYLOAD_BYTES = 256 << 20
_KEPT_INCIDENTS = 16


def node_folder(configured: str | None, job_digest: str, host: str) -> Path:
    """``<node dir>/<job>/<host>``: node-local memory by default (``/dev/shm``), per user and job.
    The host is in the path because hosts may share a disk (containers, the test lab)."""
    if configured:
        base = Path(configured)
    else:
        shm = Path("/dev/shm")
        root = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
        base = root / f"fr-otel-{os.getuid()}"
    safe_host = "".join(c if c.isalnum() or c in "-._" else "_" for c in host)[:255] or "unknown-host"
    return base / job_digest / safe_host


@dataclass(frozen=True, slots=True)
class Board:
    """What a node's leader tells its ranks: that it is alive, the incidents, what it sent on."""

    leader: int
    pid: int
    polled_ns: int  # wall clock of the leader's last poll
    incidents: tuple[tuple[int, dict[str, Any]], ...] = ()  # (k, the raiser's meta), oldest first
    sent: dict[int, tuple[int, ...]] = field(default_factory=dict)  # k -> ranks whose recorders went in its summary
    ended: tuple[int, ...] = ()  # incidents whose verdict the leader saw in the store
    lost: tuple[int, ...] = ()  # incidents whose store went away: the node goes on with them alone

    def fresh(self, now_ns: int, poll_interval: float) -> bool:
        return now_ns - self.polled_ns <= STALE_POLLS * poll_interval * 1e9

    def as_json(self) -> dict[str, Any]:
        return {"leader": self.leader, "pid": self.pid, "polled_ns": self.polled_ns,
                "incidents": [[k, meta] for k, meta in self.incidents[-_KEPT_INCIDENTS:]],
                "sent": {str(k): list(ranks) for k, ranks in sorted(self.sent.items())[-_KEPT_INCIDENTS:]},
                "ended": list(self.ended[-_KEPT_INCIDENTS:]), "lost": list(self.lost[-_KEPT_INCIDENTS:])}


def _board_from(raw: Any) -> Board | None:
    if not isinstance(raw, dict):
        return None
    leader, pid, polled = raw.get("leader"), raw.get("pid"), raw.get("polled_ns")
    if not (is_exact_int(leader) and is_exact_int(pid) and is_exact_int(polled)) or min(leader, pid, polled) < 0:
        return None
    incidents = tuple((k, meta) for k, meta in (i for i in raw.get("incidents") or () if isinstance(i, list)
                                                 and len(i) == 2)
                      if type(k) is int and k > 0 and isinstance(meta, dict))
    sent: dict[int, tuple[int, ...]] = {}
    for k, ranks in (raw.get("sent") or {}).items() if isinstance(raw.get("sent"), dict) else ():
        if k.isdigit() and isinstance(ranks, list):
            sent[int(k)] = tuple(r for r in ranks if type(r) is int and r >= 0)
    return Board(leader, pid, polled, incidents, sent, _numbers(raw.get("ended")), _numbers(raw.get("lost")))


def _numbers(raw: Any) -> tuple[int, ...]:
    """Incident numbers from untrusted JSON (anything else dropped)."""
    return tuple(k for k in raw[-_KEPT_INCIDENTS:] if type(k) is int and k > 0) if isinstance(raw, list) else ()


class NodeChannel:
    """One rank's end of its node's folder (the leader's end too)."""

    def __init__(self, folder: Path, rank: int) -> None:
        self.folder = folder
        self.rank = rank

    # -- every rank -----------------------------------------------------------------------
    def beat(self, now_ns: int, step: int | None = None) -> None:
        """This rank's heartbeat for its leader (``step``: its training step, None while not counted)."""
        atomic_write(self.folder / f"hb.{self.rank}", beat_text(now_ns, step).encode(), mkdir=True)

    def board(self) -> Board | None:
        """The leader's board, or None when there is none (yet) or it cannot be read."""
        try:
            with open(self.folder / "board", "rb") as fh:
                data = fh.read(_MAX_BOARD_BYTES + 1)
        except OSError:
            return None
        if len(data) > _MAX_BOARD_BYTES:
            return None
        try:
            return _board_from(json.loads(data))
        except ValueError:
            return None

    def drop_payload(self, k: int, payload: bytes) -> Path:
        """This rank's recorder for incident ``k``, where its leader collects it."""
        path = self.folder / f"i{k}" / f"rank_{self.rank}.payload"
        atomic_write(path, payload, mkdir=True)
        return path

    # -- the leader -----------------------------------------------------------------------
    def write_board(self, board: Board) -> None:
        atomic_write(self.folder / "board", json.dumps(board.as_json(), sort_keys=True).encode(), mkdir=True)

    def heard(self) -> dict[int, int]:
        """Each local rank's last heartbeat (wall clock ns), from the files its ranks write."""
        return {rank: ns for rank, (ns, _) in self.beats().items()}

    def beats(self) -> dict[int, tuple[int, int | None]]:
        """Each local rank's last heartbeat and its training step then (None: not counted)."""
        out: dict[int, tuple[int, int | None]] = {}
        try:
            names = os.listdir(self.folder)
        except OSError:
            return out
        for name in names:
            rank = name[3:]
            if not (name.startswith("hb.") and rank.isdigit()):
                continue
            try:
                text = (self.folder / name).read_bytes()[:32].decode("ascii", "replace").strip()
            except OSError:
                continue
            beat = parse_beat(text)
            if beat is not None:
                out[int(rank)] = beat
        return out

    def ready(self, k: int, ranks: list[int]) -> list[int]:
        """Those of ``ranks`` whose recorder for incident ``k`` is here."""
        return [r for r in ranks if (self.folder / f"i{k}" / f"rank_{r}.payload").is_file()]

    def payloads(self, k: int, ranks: list[int]) -> dict[int, bytes]:
        """The recorders of ``ranks`` dropped for incident ``k`` so far."""
        out: dict[int, bytes] = {}
        for rank in ranks:
            path = self.folder / f"i{k}" / f"rank_{rank}.payload"
            try:
                if path.stat().st_size <= _MAX_PAYLOAD_BYTES:
                    out[rank] = path.read_bytes()
            except OSError:
                continue
        return out

    def remove(self) -> None:
        """The leader leaves: its node's files go (a later job on the node starts clean)."""
        paths = sorted(self.folder.rglob("*"), key=lambda p: len(p.parts), reverse=True) if self.folder.is_dir() else []
        for path in paths:
            try:
                path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
            except OSError:
                continue
        try:
            self.folder.rmdir()
        except OSError:
            pass
