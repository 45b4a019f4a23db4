"""One agent per node talks to the job's store for the whole node: its leader.

Without leaders every rank polls the job's one store every second (100k requests a second at
100k ranks) and sends it a payload at an incident, which one coordinator then decodes rank by
rank. With them, the node is the unit:

- **Steady.** The leader (local rank 0) makes one store request per poll for its node, in turn a
  check for a new incident and the node's heartbeat (``nhb/<n>``: every local rank's last poll,
  from the heartbeat files they write; :mod:`.node_channel`). It writes a board its ranks read on
  their polls: who leads, when it last polled, the incidents it knows of. Its ranks make no store
  call at all while the board is fresh.
- **Incident.** Every local rank leaves its payload in the node's folder; the leader sends one
  summary of them and answers the coordinator's requests (:mod:`..incident.relay`: the incident
  protocol's part; this module is the role: who leads, heartbeats, the board).
- **A lost leader.** A board that stops changing (its process died, froze, or holds the GIL) sends
  the node's ranks back to the store on their own within :data:`~.node_channel.STALE_POLLS` polls
  (after the bound of the store call its board says it is in, if any: a slow store is no lost leader),
  exactly as without leaders; a rank the leader left out of its summary sends its own payload.

Every store call still goes through the bounded :class:`~.store_link.StoreLink`; every wait here
has a deadline.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from ...incident.trigger import Trigger
from ...read.rank_process import RankProcess
from .channel import IncidentChannel, job_digest
from ..config import AgentConfig
from ..guest.process_identity import local_world_size, node_number
from .node_channel import MAX_RANKS_PER_NODE, NODE_LEVELS, STALE_POLLS, Board, NodeChannel, node_folder
from ..observe.poller import Stall

__all__ = ["MAX_RANKS_PER_NODE", "Contact", "NodeRole", "node_role_for", "records_folder"]

log = logging.getLogger("fr_otel.agent")


class Contact(Enum):
    """How this rank keeps in touch with the job's store on one poll (:meth:`NodeRole.poll`)."""

    RELAYED = "relayed"  # a member with a live leader: no store call of its own
    OWNER = "owner"  # the leader's turn to look for incidents in the store
    BEAT = "beat"  # the leader's turn to send its node's heartbeat (sent already)
    FLAT = "flat"  # no live leader: this rank keeps in touch with the store itself


class NodeRole:
    """This rank's part on its node: the leader's, or a rank its leader relays for."""

    def __init__(self, channel: IncidentChannel, node: NodeChannel, rank: int, process: RankProcess, *,
                 leader: bool, poll_interval: float, world_size: int) -> None:
        self.channel = channel
        self.world_size = world_size
        self.node = node
        self.rank = rank
        self.process = process
        self.leader = leader
        self.poll_interval = poll_interval
        self.board: Board | None = None  # a member's latest fresh board
        self.sent: dict[int, tuple[int, ...]] = {}  # the leader's: k -> ranks in its summary
        self.incidents: list[Trigger] = []  # the store's incidents this rank took part in
        self.ended: list[int] = []  # the leader's: incidents whose verdict it saw in the store
        self.lost: list[int] = []  # the leader's: incidents it goes on with alone (the store went away)
        self.hangs: list[int] = []  # the leader's: of ``ended``, those whose verdict calls for a restart
        self.code_faults: list[int] = []  # the leader's: of ``hangs``, those whose action is to fix the code
        self.number: int | None = None  # the leader's node number in the store
        self.own_waits: dict[str, Any] | None = None  # the leader's: its own latest waits (slow_watch)
        self._polls = 0
        self._lost_said = False
        self._stalled_since: dict[tuple[str, int | None], float] = {}  # a member's stalls, first seen (monotonic)

    def poll(self, now_ns: int, step: int | None = None) -> Contact:
        """This poll's part (:class:`Contact`); the leader's node heartbeat is sent here. Store errors propagate."""
        self._polls += 1
        self.node.beat(now_ns, step)
        if self.leader:
            if self._polls % 2:
                return Contact.OWNER
            self.beat(now_ns, step)
            return Contact.BEAT
        board = self.node.board()
        if board is not None and board.leader != self.rank and board.fresh(now_ns, self.poll_interval):
            if self._lost_said:
                log.info("this node's leader (rank %d) answers again: its ranks go through it", board.leader)
                self._lost_said = False
            self.board = board
            return Contact.RELAYED
        if self.board is None and self._polls <= STALE_POLLS:
            return Contact.RELAYED  # the leader's first board is on its way: nothing to say yet
        if not self._lost_said:
            self._lost_said = True
            log.warning("this node's leader %s has not polled for %d polls: rank %d keeps in touch with the job's "
                        "store itself", f"(rank {self.board.leader})" if self.board else "", STALE_POLLS, self.rank)
        self.board = None
        return Contact.FLAT

    def due_to_raise(self, uncovered: list[Stall]) -> list[Stall]:
        """A member's stalls that no incident covers after its leader had :data:`STALE_POLLS` polls to raise
        or join one for them (its board then lists it and the member takes part): those the member raises
        through the store itself (a stall in a group its leader is not in). In a job-wide hang every rank
        passes its threshold within a poll: without this wait each of 100k ranks would raise at once, three
        store requests each, where the node's leader makes one or two for its node."""
        if self.board is not None and self.board.store_down:
            return uncovered  # the leader raises its own locally, which the board does not list: no wait
        now = time.monotonic()
        self._stalled_since = {s.key: self._stalled_since.get(s.key, now) for s in uncovered}
        grace = STALE_POLLS * self.poll_interval
        return [s for s in uncovered if now - self._stalled_since[s.key] >= grace]

    def store_down(self) -> bool:
        """A member's leader finds the job's store unreachable (its fresh board says so)."""
        return not self.leader and self.board is not None and self.board.store_down

    def relayed(self) -> bool:
        """A member whose leader carries its part (a fresh board)."""
        return not self.leader and self.board is not None

    def beat(self, now_ns: int, step: int | None = None) -> None:
        """The node's heartbeat: when each of its ranks last polled, and in which training step (a node
        counts once in the store)."""
        if self.number is None:
            self.number = self.channel.register_node(self.rank, self.world_size)
        beats = dict(sorted(self.node.beats().items())[:MAX_RANKS_PER_NODE])
        beats[self.rank] = (now_ns, step)
        beat: dict[str, Any] = {
            "host": self.process.host or "", "leader": self.rank, "t": now_ns,
            "ranks": {str(r): t for r, (t, _) in beats.items()},
            "steps": {str(r): s for r, (_, s) in beats.items() if s is not None}}
        waits = dict(sorted(self.node.waits().items())[:MAX_RANKS_PER_NODE])
        if self.own_waits is not None:
            waits[self.rank] = self.own_waits
        if waits:  # the slow-host watch's part rides along: no request of its own (slow_watch)
            beat["waits"] = {str(r): w for r, w in waits.items()}
        self.channel.node_heartbeat(self.number, beat)

    def publish_board(self, store_call_s: float | None = None) -> None:
        """The leader's board for its ranks (after each poll, once its summary is sent, and before each
        store call of its poll with ``store_call_s``, the longest that call may wait), stamped when
        written: a stamp taken before the poll's store calls (up to their bound) would age it early."""
        now = time.time_ns()
        until = now + int(store_call_s * 1e9) if store_call_s is not None else None
        self.node.write_board(Board(self.rank, os.getpid(), now, tuple((t.number, t.to_record()) for t in self.incidents[-16:]), dict(self.sent),
                                    tuple(self.ended[-16:]), tuple(self.lost[-16:]), until,
                                    not self.channel.reachable(), tuple(self.hangs[-16:]),
                                    tuple(self.code_faults[-16:])))

    def ended_as(self, k: int, *, verdict: bool, hang: bool = False, code_fault: bool = False) -> None:
        """The leader's word to its ranks on incident ``k``: its verdict is in the store (``verdict``; ``hang``:
        one that calls for a restart; ``code_fault``: its action is to fix the code), or the store went away
        during it and the node goes on alone."""
        if self.leader:
            (self.ended if verdict else self.lost).append(k)
            if hang:
                self.hangs.append(k)
                if code_fault:
                    self.code_faults.append(k)
            self.publish_board()

    def leader_saw_hang(self, k: int) -> bool:
        """This node's leader said incident ``k``'s verdict calls for a restart (a member's view, no store call)."""
        board = self.node.board()
        return board is not None and not self.leader and k in board.hangs

    def leader_saw_code_fault(self, k: int) -> bool:
        """This node's leader said incident ``k``'s action is to fix the code (a member's view, no store call)."""
        board = self.node.board()
        return board is not None and not self.leader and k in board.code_faults

    def verdict_word(self, k: int) -> Literal["verdict", "lost", "waiting", "ask the store"]:
        """A member's view of incident ``k`` through its leader's board: the leader saw its verdict in the
        store, or found the store gone (the node goes on alone), or neither yet; "ask the store" when
        no fresh board of another rank says (the member then checks the store itself)."""
        board = self.node.board()
        if self.leader or board is None or board.leader == self.rank or not board.fresh(time.time_ns(),
                                                                                        self.poll_interval):
            return "ask the store"
        return "verdict" if k in board.ended else "lost" if k in board.lost else "waiting"

    def local_ranks(self, now_ns: int) -> list[int]:
        """This node's ranks heard from within a few polls (the leader included)."""
        fresh = now_ns - int(STALE_POLLS * self.poll_interval * 1e9)
        return sorted({r for r, t in self.node.heard().items() if t >= fresh} | {self.rank})


def _folder(config: AgentConfig, job_id: str, process: RankProcess, environ: Mapping[str, str]) -> Path:
    return node_folder(config.node_dir, job_digest(job_id), process.host or "unknown-host", node=node_number(environ))


def records_folder(config: AgentConfig, job_id: str, rank: int, world_size: int, process: RankProcess,
                   environ: Mapping[str, str], role: NodeRole | None) -> NodeChannel | None:
    """Where this node's ranks keep their last records (:mod:`..observe.last_record`): its leader's folder, or the
    same folder made for them alone (a job on one node has no leader); None, with one line, when it cannot be made."""
    if role is not None:
        return role.node
    try:
        return NodeChannel(_folder(config, job_id, process, environ), rank, levels=NODE_LEVELS, world_size=world_size)
    except OSError as exc:
        log.warning("rank %d keeps no last record on its node (an incident cannot read its state if it stops "
                    "answering): its node folder: %s", rank, exc.strerror or exc)
        return None


def node_role_for(config: AgentConfig, channel: IncidentChannel, job_id: str, rank: int, world_size: int,
                  process: RankProcess, local_rank: int | None, environ: Mapping[str, str]) -> NodeRole | None:
    """This rank's node role, or None where every rank talks to the store itself: node leaders ``off``,
    no local rank known, or (``auto``) a job on one node, or one rank per node."""
    if config.node_leaders == "off" or local_rank is None:
        return None
    local_world = local_world_size(environ)
    if config.node_leaders == "auto" and not (local_world and 1 < local_world < world_size):
        return None
    try:
        folder = _folder(config, job_id, process, environ)
    except OSError as exc:
        log.warning("node leaders off for rank %d: its node folder: %s; it talks to the job's store itself",
                    rank, exc.strerror or exc)
        return None
    node = NodeChannel(folder, rank, levels=NODE_LEVELS, world_size=world_size, seal=channel.seal)
    return NodeRole(channel, node, rank, process,
                    leader=local_rank == 0, poll_interval=config.poll_interval, world_size=world_size)
