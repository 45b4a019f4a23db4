"""The coordinator's gathering through the store: every live rank's recorder, and who is silent.

Waits, bounded, for the payload of every rank still heard from (a rank whose heartbeat is a few
polls old is presumed lost and not waited for: the verdict comes as soon as everyone alive has
sent theirs), takes the exit copies of ranks that ended earlier, and adds what the dumps cannot
say: where every rank runs (the host map), when each was last heard from, and which other hosts
this node can still reach. A store that stops answering mid-way raises
:class:`~..links.store_link.StoreUnavailable`: the coordinator then reports its own node's part without it
(:mod:`.local`), with the heartbeats it read before (its own ranks' and its node leaders',
remembered by the channel).

With node leaders (:mod:`..links.node_leader`) most ranks arrive in their node's summary: compact
dumps, decoded as they arrive (during the wait, not after the last one), and whole payloads for
ranks that stood out on their node. Ranks whose leader was lost arrive one by one, as without
leaders. After the first verdict, :func:`complete_from_nodes` asks the leaders for the whole
recorders of the ranks the verdict and its trace look at closely (culprits and their peers) that
only came compact.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...common.files import atomic_write, own_folder
from ...common.ids import trace_hex_for
from ...common.names import host_name
from ...common.ranks import compress_ranks
from ...diagnosis.job import Job
from ...diagnosis.verdict import Verdict
from ...read.node_summary import NodeSummary, decode_node_summary
from ...read.pg_meta import member_runs
from ...read.rank_process import RankProcess
from ...read.reader import ReadResult
from ...trace.options import TraceOptions
from ...trace.selection import detailed_ranks
from .rank import DUMP_FILE_PREFIX, IncidentRank, dump_path
from ..observe.last_record import MAX_RECORD_BYTES, load_record
from ..observe.payload import decode_payload
from ..links.store_link import StoreUnavailable

__all__ = ["SILENT_POLLS", "WHOLE_WAIT_POLLS", "Gathered", "add_last_records", "add_side_facts", "complete_from_nodes",
           "gather", "read_heartbeats", "silent_ranks"]

#: A rank whose heartbeat is this many polls old when an incident is raised is presumed lost: not waited for.
SILENT_POLLS = 3
#: How long (in polls) the coordinator waits for the whole recorders it asked node leaders for.
WHOLE_WAIT_POLLS = 3
_GATHER_POLL_S = 0.05
_NODE_BEAT_POLLS = 2  # a leader beats for its node every other poll


@dataclass(slots=True)
class Gathered:
    """What the coordinator gathered, and what it must clean up after."""

    evidence: ReadResult
    flat_ranks: list[int] = field(default_factory=list)  # ranks whose payloads came one by one
    summaries: int = 0  # node summaries read
    asked: bool = False  # whole recorders were asked of the leaders (i/<k>/need is set)


def gather(me: IncidentRank, k: int, deadline: float, expected: Collection[int] = ()) -> Gathered:
    """Every rank's recorder for incident ``k`` that arrives in time (ranks that exited earlier
    left one at exit), decoded into the evidence the pipeline reads, with where every rank runs
    and when each was last heard from. Ranks silent for a few polls already (a lost node) are not
    waited for, and one that dies during the gathering stops being waited for once its heartbeat
    is that old: the verdict comes as soon as everyone still alive has sent theirs. ``expected``
    ranks are waited for (until the gathering's bound) however old their heartbeat: the ranks of a
    slow host that the incident is about, whose agents beat late because their CPU is throttled,
    and without whose recorders the verdict could not name them."""
    world = me.world_size
    ranks = list(range(world))
    problems: list[str] = []
    read = ReadResult(problems=problems)
    out = Gathered(read)
    gather_until = min(time.monotonic() + me.config.gather_seconds, deadline)
    wanted = frozenset(r for r in expected if 0 <= r < world)
    node_hosts, relayed = read_heartbeats(me)
    heard = me.channel.heard
    summaries = _Summaries(me, k, read)
    checked = time.monotonic()
    alive = _alive(me, heard, relayed, wanted)  # a loop over every rank: counted once per heartbeat read
    while True:
        while me.channel.arrived(k) < alive and time.monotonic() < gather_until:
            if not summaries.take():  # decoded as they come: the wait is not wasted
                time.sleep(_GATHER_POLL_S)
            if time.monotonic() - checked >= me.config.poll_interval:  # a rank that dies now stops beating
                node_hosts, relayed = read_heartbeats(me)
                alive, checked = _alive(me, heard, relayed, wanted), time.monotonic()
        summaries.take()
        out.flat_ranks = [r for r in ranks if r not in read.dumps]
        payloads = me.channel.fetch(k, out.flat_ranks)
        # The counter counts sends, not ranks: a rank whose leader's summary came late also sent its own,
        # and is counted twice. Done only when as many distinct ranks are in as are alive.
        if len(read.dumps) + len(payloads) >= alive or time.monotonic() >= gather_until:
            break
        time.sleep(min(me.config.poll_interval, max(0.0, gather_until - time.monotonic())))
        node_hosts, relayed = read_heartbeats(me)
        alive, checked = _alive(me, heard, relayed, wanted), time.monotonic()
    out.summaries = summaries.last
    late = [r for r in out.flat_ranks if r not in payloads]
    finals = me.channel.fetch_final(late) if late else {}
    me.hosts.from_disk()
    unknown = [r for r in late if r not in finals and r not in me.hosts.processes and r not in node_hosts]
    if unknown:
        me.hosts.gather(unknown)
    for rank, payload in sorted({**finals, **payloads}.items()):
        source = f"rank {rank} ({'at its exit' if rank in finals and rank not in payloads else 'live'})"
        dump = decode_payload(payload, rank, source, problems)
        if dump is not None:
            read.dumps[rank] = dump
    gone = [r for r in ranks if r not in read.dumps]
    if gone:
        known = {*me.channel.heard, *me.hosts.processes, *node_hosts}
        problems.extend(silent_ranks(gone, known, me.config.gather_seconds))
        add_last_records(me, read, gone, dump_path(me, trace_hex_for(me.job_id, str(k))).parent)
    add_side_facts(me, read, node_hosts)
    return out


def add_last_records(me: IncidentRank, read: ReadResult, silent: Collection[int], folder: Path) -> None:
    """The last records (:mod:`..observe.last_record`) of the ``silent`` ranks of this node, read from its folder:
    each becomes the rank's dump, and its file in the incident's ``folder`` (``fr-otel analyze`` of the folder
    reads the same). A rank of this node without one, or whose one is refused, says why in one line."""
    node = me.records
    if node is None:
        return
    host = me.process.host
    now = time.time_ns()
    heard = me.channel.heard
    said: list[str] = []
    for rank in sorted(silent):
        where = me.hosts.processes.get(rank)
        local = where is not None and where.host == host and host is not None
        found = node.record_of(rank, MAX_RECORD_BYTES)
        if found is None:
            if local:
                said.append(f"rank {rank} left no last record on its node (it stopped before its agent's first poll, "
                            "or its agent was off)")
            continue
        pid = where.pid if where is not None else None
        got = load_record(found[0], found[1], rank, pid=pid, heard_ns=heard.get(rank), now_ns=now,
                          poll_interval=me.config.poll_interval, source=f"rank {rank} (its last record, on its node)")
        if isinstance(got, str):
            said.append(f"rank {rank}'s last record on its node is not used: {got}")
            continue
        dump, kept = got
        read.dumps[rank] = dump
        assert dump.record is not None
        said.append(f"rank {rank} sent nothing: its state is {dump.record.said()}, from its node's folder")
        with me.health.guard("keeping a silent rank's last record in the incident's folder"):
            own_folder(folder)
            atomic_write(folder / f"{DUMP_FILE_PREFIX}{rank}", kept)
    read.problems.extend(said)


def silent_ranks(gone: Collection[int], known: Collection[int], gather_s: float) -> list[str]:
    """What to say of the ranks whose recorder did not come: one never heard from ran no agent (its launcher
    started none: that says nothing of the rank), one heard from before went silent."""
    never = [r for r in gone if r not in known]
    silent = [r for r in gone if r in known]
    lines = []
    if never:
        lines.append(f"rank(s) {compress_ranks(never)}: no agent (never heard from since the job started, so not "
                     "known to be stuck; fr-otel run, or fr_otel.start() at the top of the script, starts one)")
    if silent:
        lines.append(f"rank(s) {compress_ranks(silent)} sent no recorder within {gather_s:g} s "
                     "(stuck with the GIL held, cut off, or dead)")
    return lines


def add_side_facts(me: IncidentRank, read: ReadResult, node_hosts: Mapping[int, str] | None = None,
                   store_lost_since_ns: int | None = None) -> None:
    """What the recorders cannot say, for every way of gathering them (the store, node leaders, a node on its
    own): where every rank runs (the host map, then the host its node's heartbeat names), the job's size,
    when each rank was last heard from and in which step (the heartbeats read, before the store went if it
    did), the store's host, and the network as this node sees it now (probing the hosts of the ranks that
    sent nothing; ``store_lost_since_ns``: see :meth:`.rank.IncidentRank.network_now`)."""
    side = read.side
    side.processes = dict(me.hosts.processes)
    for rank, host in (node_hosts or {}).items():
        side.processes.setdefault(rank, RankProcess(host=host, source="node heartbeat"))
    side.world_size = me.world_size
    side.last_heard = dict(me.channel.heard)
    side.last_step = {r: s for r, s in me.channel.steps.items() if r in side.last_heard}  # their step at that beat
    side.store_host = me.hosts.store_host
    silent = {side.processes[r].host for r in range(me.world_size) if r not in read.dumps and r in side.processes}
    side.network = me.network_now({h for h in silent if h}, store_lost_since_ns)


class _Summaries:
    """The node summaries of one incident, fetched and decoded as they arrive."""

    def __init__(self, me: IncidentRank, k: int, read: ReadResult) -> None:
        self.me, self.k, self.read = me, k, read
        self.done: set[int] = set()
        self.upto = 0  # every summary up to this number is in
        self.last = 0
        self.shared: dict[tuple[str, Any], Any] = {}  # equal columns, texts, groups: one object across summaries
        self.from_nodes: dict[int, str] = {}  # rank -> the host whose summary brought it

    def take(self) -> bool:
        """Fetch and decode the summaries sent since the last look; False when none was new."""
        new = {j: b for j, b in self.me.channel.summaries(self.k, self.me.world_size, self.upto).items() if j not in self.done}
        for j, blob in sorted(new.items()):
            self.done.add(j)
            self.last = max(self.last, j)
            self._add(decode_node_summary(blob, f"node summary {j}", self.read.problems, self.shared))
        while self.upto + 1 in self.done:
            self.upto += 1
        return bool(new)

    def _add(self, node: NodeSummary | None) -> None:
        """One node's part, trusted no further than the job's shape: ranks outside the world are dropped,
        and a rank another node's summary already brought stays as that one said (one line each)."""
        if node is None:
            return
        world, where = self.me.world_size, node.host or "?"
        foreign = sorted({r for r in (*node.dumps, *node.heard, *node.full) if not 0 <= r < world})
        if foreign:
            self.read.problems.append(f"node summary from {where} names rank(s) outside the job of {world}: "
                                      f"{compress_ranks(foreign)} (ignored)")
        twice = sorted(r for r in node.dumps if r in self.from_nodes and 0 <= r < world)
        if twice:
            self.read.problems.append(f"node summary from {where} repeats rank(s) {compress_ranks(twice)} that "
                                      "another node's summary sent (the first kept)")
        for rank, compact in node.dumps.items():
            if 0 <= rank < world and rank not in self.from_nodes:
                self.read.dumps[rank] = compact
                self.from_nodes[rank] = where
        for rank, t in node.heard.items():
            if 0 <= rank < world:
                self.me.channel.note_beat(rank, t, None)
        for rank, whole in node.full.items():
            if not (0 <= rank < world and self.from_nodes.setdefault(rank, where) == where):
                continue
            dump = decode_payload(whole, rank, f"rank {rank} (from its node, {where})", self.read.problems)
            if dump is not None:
                self.read.dumps[rank] = dump
                if dump.record is not None:
                    self.read.problems.append(f"rank {rank} sent nothing: its state is {dump.record.said()}, from "
                                              f"its node's folder ({where})")


def read_heartbeats(me: IncidentRank) -> tuple[dict[int, str], set[int]]:
    """When each rank was last heard from and its training step then, remembered by the channel
    (:meth:`~..links.channel.IncidentChannel.note_beat`: node heartbeats, then the heartbeats of ranks no
    live leader beats for); returns the host each node heartbeat names for its ranks and the ranks a
    live leader beats for. Store errors propagate."""
    now = time.time_ns()
    period = me.config.poll_interval * 1e9
    hosts: dict[int, str] = {}
    relayed: set[int] = set()
    for beat in me.channel.node_heartbeats(me.world_size).values():
        host, t, beat_ranks = host_name(beat.get("host")), beat.get("t"), beat.get("ranks")
        if not isinstance(beat_ranks, dict) or type(t) is not int:
            continue
        raw_steps = beat.get("steps")
        beat_steps: dict[str, Any] = raw_steps if isinstance(raw_steps, dict) else {}
        fresh = now - t <= SILENT_POLLS * _NODE_BEAT_POLLS * period
        for key, ns in beat_ranks.items():
            if not (isinstance(key, str) and key.isascii() and key.isdigit() and type(ns) is int):
                continue
            rank = int(key)
            if rank >= me.world_size:
                continue
            step = beat_steps.get(key)
            me.channel.note_beat(rank, ns, step if type(step) is int and step >= 0 else None)
            if host:
                hosts[rank] = host
            if fresh:
                relayed.add(rank)
    me.channel.last_heard([r for r in range(me.world_size) if r not in relayed])
    return hosts, relayed


def _alive(me: IncidentRank, heard: dict[int, int], relayed: set[int], expected: frozenset[int]) -> int:
    """How many ranks beat within the last few polls (a node's, for ranks its leader beats for; this
    rank counts: it is gathering), or are ``expected`` whatever their heartbeat says."""
    now = time.time_ns()
    period = me.config.poll_interval * 1e9
    alive = 0
    for r in range(me.world_size):
        window = SILENT_POLLS * (_NODE_BEAT_POLLS if r in relayed else 1) * period
        alive += r == me.rank or r in expected or heard.get(r, 0) >= now - window
    return alive


def complete_from_nodes(me: IncidentRank, k: int, gathered: Gathered, deadline: float, job: Job, verdict: Verdict,
                        *, options: TraceOptions) -> bool:
    """The pipeline's second look: the whole recorders of the culprits and of the ranks the trace shows
    in full that came only compact, asked of their node leaders and waited for (bounded); True when
    any arrived (the job is then modelled and analysed again)."""
    read = gathered.evidence
    wanted = {c.rank for c in verdict.culprits} | (detailed_ranks(job, verdict, options) or set())
    need = sorted(r for r in wanted if r in read.dumps and read.dumps[r].compact)
    got: dict[int, bytes] = {}
    try:
        me.channel.ask(k, member_runs(need))
        gathered.asked = True
        until = min(deadline - me.export_config.timeout_s / 2,
                    time.monotonic() + WHOLE_WAIT_POLLS * me.config.poll_interval + 2.0)
        while need and time.monotonic() < until:
            got.update(me.channel.fetch(k, [r for r in need if r not in got]))
            if len(got) == len(need):
                break
            time.sleep(_GATHER_POLL_S * 2)
    except StoreUnavailable as exc:
        read.problems.append(f"the job's store stopped answering while whole recorders were asked for ({exc})")
    for rank, payload in sorted(got.items()):
        dump = decode_payload(payload, rank, f"rank {rank} (whole, asked of its node)", read.problems)
        if dump is not None:
            read.dumps[rank] = dump
    gathered.flat_ranks.extend(need)  # the store is cleaned of all asked for, the late ones included
    missing = [r for r in need if r not in got]
    if missing:
        read.problems.append(f"rank(s) {compress_ranks(missing)}: only their node's summary arrived (their stacks and "
                             "older entries stayed on their node)")
    return bool(got)
