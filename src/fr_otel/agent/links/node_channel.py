"""The node-local channel between a node's leader and its other ranks: small files on the node's own disk.

A node leader (:mod:`.node_leader`) talks to the job's store for its whole node; its ranks talk
only to it, through a folder on the node (``/dev/shm`` by default: memory, never a network file
system, so no call here can block on anything but the local kernel):

- ``board``: written by the leader on every poll and before each of its store calls: who leads
  (rank, pid), when it wrote it (wall clock), until when a store call it is in may last, the
  incidents it knows of, and for each which ranks' recorders it has sent on;
- ``hb.<rank>``: each rank's heartbeat (the wall clock of its last poll and its training step then),
  which the leader sends on in one heartbeat for the node;
- ``i<k>/rank_<r>.payload``: a rank's recorder for incident k, for the leader to summarise;
- ``w.<rank>``: a rank's recent waits (:mod:`..slow_watch`), which the leader sends on in its heartbeat;
- ``last.<rank>``: a rank's last record (:mod:`..observe.last_record`), which an incident loads for a rank that
  sends nothing (made for every job with incidents, node leaders or not; each rank removes its own on its way out).

Files, not sockets: a leader that dies or freezes leaves a board that simply stops changing, and
its ranks notice within a few polls (:meth:`Board.fresh`; later by the bound of a store call the
board says the leader is in) and go back to the job's store themselves. Every write is atomic (write, then rename), so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...common.files import OutputRefused, atomic_write, file_kind, open_regular, read_regular
from ...common.json_types import is_exact_int
from ...common.log import logger
from ..observe.payload import MAX_PAYLOAD_BYTES
from .channel import MAX_RANKS_PER_NODE, beat_text, parse_beat
from .signing import SEAL_BYTES, Seal
from .store_trust import Forgeries

__all__ = ["MAX_RANKS_PER_NODE", "MAX_SCANNED", "NODE_LEVELS", "STALE_POLLS", "Board", "NodeChannel", "node_folder",
           "private_folder"]

#: A board (or a rank's heartbeat) this many polls old: its writer is presumed lost.
STALE_POLLS = 3
#: Entries of a node folder looked at per read: a real one holds two files per rank, the board and a few
#: incident folders and temporary files.
MAX_SCANNED = 2 * MAX_RANKS_PER_NODE + 64
#: The longest store call a board may announce (a larger one is malformed: the stale window holds).
_MAX_ANNOUNCED_NS = 60 * 10**9
_MAX_BOARD_BYTES = 1 << 20
_MAX_BEAT_BYTES = 64
_MAX_WAITS_BYTES = 16 << 10
_KEPT_INCIDENTS = 16
_FOLDER_MODE = 0o700
_FILE_MODE = 0o600
#: The names fr-otel writes in a node folder (and their temporary files): all :meth:`NodeChannel.remove` deletes.
_OURS = re.compile(r"\.?(board|hb\.\d+|w\.\d+|last\.\d+|rank_\d+\.payload)(\.[A-Za-z0-9_]+\.tmp)?")
_INCIDENT_FOLDER = re.compile(r"i\d+")
#: The folders above a node folder that fr-otel makes and checks: its job's and the base.
NODE_LEVELS = 2

log = logger("fr_otel.agent")


def node_folder(configured: str | None, job_digest: str, host: str, shared_root: Path | None = None,
                node: str = "") -> Path:
    """``<node dir>/<job>/<host>[.node<n>]``, made (0o700) and checked: node-local memory by default
    (``/dev/shm``), per user and job. The host is in the path because hosts may share a disk
    (containers, the test lab); the node's number in the job (``node``) because one host may run
    two of its nodes (``torchrun --nnodes 2`` twice on one machine), each with its own leader. The default
    base, ``fr-otel-<uid>``, has a name anyone can guess in a folder anyone can write, and a configured
    one may sit in such a folder too: the base, the job's folder and the node's must each be a real
    directory of ours that no one else may enter (:func:`private_folder`), else :class:`OutputRefused`.
    ``shared_root``: where the default base goes (default ``/dev/shm``, else the temporary folder).
    Raises OSError when the folders cannot be made."""
    if configured:
        Path(configured).parent.mkdir(parents=True, exist_ok=True)  # above the base: the person's own folders
        base = Path(configured)
    else:
        shm = Path("/dev/shm")
        root = shared_root or (shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir()))
        base = root / f"fr-otel-{os.getuid()}"
    safe_host = "".join(c if c.isalnum() or c in "-._" else "_" for c in host)[:200] or "unknown-host"
    if node.isascii() and node.isdigit() and len(node) < 10:
        safe_host += f".node{int(node)}"
    return private_folder(base / job_digest / safe_host, NODE_LEVELS)


def private_folder(folder: Path, above: int = 0) -> Path:
    """``folder`` made 0o700 if missing (after the ``above`` levels over it, each made and checked the same way);
    refused (:class:`OutputRefused`) unless it is a directory (not a link) of this user's that no one
    else may enter. Every level, configured or default: another user's folder planted at any of them
    (a world-writable ``FR_OTEL_NODE_DIR``) would hand our ranks' recorders and board to its owner."""
    if above > 0:  # top down: nothing is made inside a level before that level is known to be ours
        private_folder(folder.parent, above - 1)
    try:
        os.mkdir(folder, _FOLDER_MODE)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else file_kind(st.st_mode)
        raise OutputRefused(f"{folder}: is {kind}, not a directory")
    if st.st_uid != os.getuid():
        raise OutputRefused(f"{folder}: owned by uid {st.st_uid}, not this user ({os.getuid()})")
    if st.st_mode & 0o077:
        raise OutputRefused(f"{folder}: mode {stat.S_IMODE(st.st_mode):o}: others may enter it (want 700)")
    return folder


@dataclass(frozen=True, slots=True)
class Board:
    """What a node's leader tells its ranks: that it is alive, the incidents, what it sent on."""

    leader: int
    pid: int
    polled_ns: int  # wall clock of the leader's last board write (each poll, and before each store call)
    incidents: tuple[tuple[int, dict[str, Any]], ...] = ()  # (k, the owner record: Trigger.to_record), oldest first
    sent: dict[int, tuple[int, ...]] = field(default_factory=dict)  # k -> ranks whose recorders went in its summary
    ended: tuple[int, ...] = ()  # incidents whose verdict the leader saw in the store
    lost: tuple[int, ...] = ()  # incidents whose store went away: the node goes on with them alone
    in_store_call_until_ns: int | None = None  # written just before a store call: the latest it can end
    store_down: bool = False  # the leader's store link does not answer: its ranks go on without the store
    hangs: tuple[int, ...] = ()  # of ``ended``, those whose verdict calls for a restart (FR_OTEL_ON_HANG=abort)
    code_faults: tuple[int, ...] = ()  # of ``hangs``, those whose action is to fix the code (exit 70, not 75)

    def fresh(self, now_ns: int, poll_interval: float) -> bool:
        """Written within the last few polls, or in a store call that may still be running (the link bounds
        it): a leader waiting on a slow store is alive, and its ranks going to that store themselves would
        only add load to it. A stamp more than a poll ahead of our clock is no proof of life."""
        age = now_ns - self.polled_ns
        window = STALE_POLLS * poll_interval * 1e9
        if age < -poll_interval * 1e9:
            return False
        if age <= window:
            return True
        until = self.in_store_call_until_ns
        return until is not None and 0 <= until - self.polled_ns <= _MAX_ANNOUNCED_NS and now_ns <= until + window

    def as_json(self) -> dict[str, Any]:
        return {"leader": self.leader, "pid": self.pid, "polled_ns": self.polled_ns,
                "incidents": [[k, meta] for k, meta in self.incidents[-_KEPT_INCIDENTS:]],
                "sent": {str(k): list(ranks) for k, ranks in sorted(self.sent.items())[-_KEPT_INCIDENTS:]},
                "ended": list(self.ended[-_KEPT_INCIDENTS:]), "lost": list(self.lost[-_KEPT_INCIDENTS:]),
                "in_store_call_until_ns": self.in_store_call_until_ns, "store_down": self.store_down,
                "hangs": list(self.hangs[-_KEPT_INCIDENTS:]), "code_faults": list(self.code_faults[-_KEPT_INCIDENTS:])}


def _board_from(raw: Any) -> Board | None:
    """A board from untrusted JSON: None without its leader, pid and stamp; any other field of the
    wrong shape is dropped."""
    if not isinstance(raw, dict):
        return None
    leader, pid, polled = raw.get("leader"), raw.get("pid"), raw.get("polled_ns")
    if not (is_exact_int(leader) and is_exact_int(pid) and is_exact_int(polled)) or min(leader, pid, polled) < 0:
        return None
    listed = raw.get("incidents")
    incidents = tuple((k, meta) for k, meta in (i for i in (listed if isinstance(listed, list) else ())
                                                 if isinstance(i, list) and len(i) == 2)
                      if type(k) is int and k > 0 and isinstance(meta, dict))
    sent: dict[int, tuple[int, ...]] = {}
    for k, ranks in raw["sent"].items() if isinstance(raw.get("sent"), dict) else ():
        if k.isdigit() and isinstance(ranks, list):
            sent[int(k)] = tuple(r for r in ranks if type(r) is int and r >= 0)
    until = raw.get("in_store_call_until_ns")
    return Board(leader, pid, polled, incidents, sent, _numbers(raw.get("ended")), _numbers(raw.get("lost")),
                 until if is_exact_int(until) else None, raw.get("store_down") is True, _numbers(raw.get("hangs")),
                 _numbers(raw.get("code_faults")))


def _numbers(raw: Any) -> tuple[int, ...]:
    """Incident numbers from untrusted JSON (anything else dropped)."""
    return tuple(k for k in raw[-_KEPT_INCIDENTS:] if type(k) is int and k > 0) if isinstance(raw, list) else ()


class NodeChannel:
    """One rank's end of its node's folder (the leader's end too)."""

    def __init__(self, folder: Path, rank: int, *, levels: int = 0, world_size: int | None = None,
                 seal: Seal | None = None) -> None:
        self.folder = folder
        #: Signs every file written and verifies every file read, as the store's records (:mod:`.signing`).
        self.seal = seal
        self.forged = Forgeries()
        self.rank = rank
        #: Folders above ``folder`` made again (and checked) when it is gone: :data:`NODE_LEVELS` for a
        #: :func:`node_folder` (a folder removed under the job is remade whole, never inside a stranger's).
        self.levels = levels
        #: Ranks at or above it are no rank of this job: their files are not read (None: not known).
        self.world_size = world_size
        self._crowded_said = False

    # -- every rank -----------------------------------------------------------------------
    def beat(self, now_ns: int, step: int | None = None) -> None:
        """This rank's heartbeat for its leader (``step``: its training step, None while not counted)."""
        self._write(f"hb.{self.rank}", beat_text(now_ns, step).encode())

    def board(self) -> Board | None:
        """The leader's board, or None when there is none (yet) or it cannot be read."""
        try:
            data = self._opened("board", read_regular(self.folder / "board", _MAX_BOARD_BYTES + SEAL_BYTES,
                                                       follow_links=False))
            return _board_from(json.loads(data)) if data is not None else None
        except (OSError, ValueError, RecursionError):
            return None  # missing, planted (a FIFO, a link to /dev/zero), too large, or not a board

    def drop_waits(self, summary: dict[str, Any]) -> None:
        """This rank's recent waits (what the slow-host watch compares), for its leader to send on."""
        self._write(f"w.{self.rank}", json.dumps(summary, separators=(",", ":")).encode())

    def keep_record(self, data: bytes) -> None:
        """This rank's last record (:mod:`..observe.last_record`), for its host-mates to read once it stops answering."""
        self._write(f"last.{self.rank}", data)

    def vouch_record(self) -> None:
        """This rank's agent found its record unchanged: the file's time says when (no write, one system call)."""
        os.utime(self.folder / f"last.{self.rank}", follow_symlinks=False)

    def drop_record(self) -> None:
        """This rank's record goes (its way out: it speaks for itself, and a later job on the node starts clean),
        and the node's folder with it when nothing else is left there."""
        for remove, path in ((os.unlink, self.folder / f"last.{self.rank}"), (os.rmdir, self.folder)):
            try:
                remove(path)
            except OSError:
                pass

    def record_of(self, rank: int, limit: int) -> tuple[bytes, int] | None:
        """Rank ``rank``'s last record and the file's time (when its agent last vouched for it); None when there
        is none, or it is no regular file of at most ``limit`` bytes (never through a link)."""
        try:
            fd, st = open_regular(self.folder / f"last.{rank}", follow_links=False)
        except OSError:
            return None
        with open(fd, "rb") as fh:
            data = fh.read(limit + 1) if st.st_size <= limit else None
        return (data, st.st_mtime_ns) if data is not None and len(data) <= limit else None

    def drop_payload(self, k: int, payload: bytes) -> Path:
        """This rank's recorder for incident ``k``, where its leader collects it."""
        return self._write(f"i{k}/rank_{self.rank}.payload", payload)

    def _write(self, name: str, data: bytes) -> Path:
        """``name`` (0o600) under this node's folder, its folders (0o700; remade if a leader that left
        removed them) refused if a link or not a directory."""
        folder, relative = private_folder(self.folder, self.levels), name
        if "/" in name:
            sub, name = name.split("/")
            folder = private_folder(folder / sub)
        # Not synced: nothing here means anything after a crash, and on a disk (no /dev/shm) a sync per
        # heartbeat per rank per poll would be I/O for nothing.
        signed = data if self.seal is None else self.seal.sign(f"node/{relative}", data)
        return atomic_write(folder / name, signed, mode=_FILE_MODE, durable=False)

    def _opened(self, name: str, data: bytes) -> bytes | None:
        """What was read from ``name``, verified; None (said once per kind of file) when the job did not sign it."""
        if self.seal is None:
            return data
        value = self.seal.open(f"node/{name}", data)
        if value is None:
            self.forged(f"node folder {re.sub(r'[0-9]+', '<n>', name)} file without this job's signature",
                        f"{self.folder / name} does not verify under the job's secret")
        return value

    # -- the leader -----------------------------------------------------------------------
    def write_board(self, board: Board) -> None:
        self._write("board", json.dumps(board.as_json(), sort_keys=True).encode())

    def heard(self) -> dict[int, int]:
        """Each local rank's last heartbeat (wall clock ns), from the files its ranks write."""
        return {rank: ns for rank, (ns, _) in self.beats().items()}

    def beats(self) -> dict[int, tuple[int, int | None]]:
        """Each local rank's last heartbeat and its training step then (None: not counted)."""
        out: dict[int, tuple[int, int | None]] = {}
        for rank, data in self._rank_files("hb.", _MAX_BEAT_BYTES):
            beat = parse_beat(data.decode("ascii", "replace"))
            if beat is not None:
                out[rank] = beat
        return out

    def waits(self) -> dict[int, dict[str, Any]]:
        """Each local rank's latest waits, from the files its ranks write (unreadable or malformed ones left out)."""
        out: dict[int, dict[str, Any]] = {}
        for rank, data in self._rank_files("w.", _MAX_WAITS_BYTES):
            try:
                raw = json.loads(data)
            except (ValueError, RecursionError):
                continue
            if isinstance(raw, dict):
                out[rank] = raw
        return out

    def _rank_files(self, prefix: str, limit: int) -> list[tuple[int, bytes]]:
        """(rank, contents) of the node folder's ``<prefix><rank>`` files: regular files only, never through
        a link, each bounded; the unreadable left out."""
        out = []
        for name in self._names(prefix):
            try:
                data = self._opened(name, read_regular(self.folder / name, limit + SEAL_BYTES, follow_links=False))
            except OSError:
                continue
            if data is not None:
                out.append((int(name[len(prefix):]), data))
        return out

    def _names(self, prefix: str) -> list[str]:
        """The ``<prefix><rank>`` names of the node folder, found before any is read: at most
        :data:`MAX_SCANNED` entries looked at (``os.scandir``, stopped there) and :data:`MAX_RANKS_PER_NODE`
        names kept, a rank outside the job's skipped; one log line when the folder holds more than that
        (50,000 planted ``hb.N`` files cost a leader 0.7 s a beat when each was read)."""
        names: list[str] = []
        scanned = 0
        crowded = False
        try:
            with os.scandir(self.folder) as entries:
                for entry in entries:
                    scanned += 1
                    if scanned > MAX_SCANNED or len(names) >= MAX_RANKS_PER_NODE:
                        crowded = True
                        break
                    rank = entry.name[len(prefix):]
                    if not (entry.name.startswith(prefix) and rank.isascii() and rank.isdigit() and len(rank) < 10):
                        continue
                    if self.world_size is not None and int(rank) >= self.world_size:
                        continue
                    names.append(entry.name)
        except OSError:
            return names
        if crowded and not self._crowded_said:
            self._crowded_said = True
            log.warning("the node folder %s holds more than %d entries (or %d %s files): only those are read; "
                        "files planted there?", self.folder, MAX_SCANNED, MAX_RANKS_PER_NODE, prefix + "N")
        return names

    def ready(self, k: int, ranks: list[int]) -> list[int]:
        """Those of ``ranks`` whose recorder for incident ``k`` is here."""
        return [r for r in ranks if (self.folder / f"i{k}" / f"rank_{r}.payload").is_file()]

    def payloads(self, k: int, ranks: list[int]) -> dict[int, bytes]:
        """The recorders of ``ranks`` dropped for incident ``k`` so far."""
        out: dict[int, bytes] = {}
        for rank in ranks:
            path = self.folder / f"i{k}" / f"rank_{rank}.payload"
            try:
                data = self._opened(f"i{k}/rank_{rank}.payload",
                                    read_regular(path, MAX_PAYLOAD_BYTES + SEAL_BYTES, follow_links=False))
            except OSError:
                continue
            if data is not None:
                out[rank] = data
        return out

    def forget(self, k: int) -> None:
        """Incident ``k``'s payloads go (the leader, once the coordinator no longer asks for them): a node
        folder in memory must not keep every incident's recorders until the job ends."""
        try:
            root = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            _remove_incident(root, f"i{k}")
        finally:
            os.close(root)

    def remove(self) -> None:
        """The leader leaves: its node's files go (a later job on the node starts clean). Only names
        fr-otel writes, and never through a link: a name swapped for one is left alone."""
        try:
            root = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            for name in os.listdir(root):
                if _INCIDENT_FOLDER.fullmatch(name):
                    _remove_incident(root, name)
                elif _OURS.fullmatch(name):
                    _unlink_file(root, name)
        finally:
            os.close(root)
        try:
            self.folder.rmdir()
        except OSError:
            pass


def _unlink_file(dir_fd: int, name: str) -> None:
    """``name`` in ``dir_fd`` unlinked if it is a file or a link (a link goes, its target stays)."""
    try:
        if not stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode):
            os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _remove_incident(root: int, name: str) -> None:
    """An ``i<k>`` folder's payloads, then the folder (opened without following a link)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
    except OSError:
        _unlink_file(root, name)  # a link (or file) at the name goes itself; what it points to stays
        return
    try:
        for entry in os.listdir(fd):
            if _OURS.fullmatch(entry):
                _unlink_file(fd, entry)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=root)
    except OSError:
        pass
