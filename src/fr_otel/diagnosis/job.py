"""The job as a whole: ranks, process groups by identity, progress per group.

A process group is identified by its name (+ desc + member set), never by the
local ``pg_id`` slot, which differs between ranks. Membership comes from
``pg_config`` when it is sound and is inferred from entries when it is not
(gloo in torch 2.13 records an empty config). Each rank's local ids are paired
with group names from its entries, and, for ranks without entries (idle ranks
in only-active dumps), by creation order, checked against every known pair.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import compress
from operator import not_
from typing import Any

from ..common.ranks import compress_ranks
from ..read.discovery import host_from_name
from ..read.dump import Entry, GroupHistory, Progress, RankDump
from ..read.entry_rules import creation_order, is_default_group, unnamed_world
from ..read.network import NetworkFacts
from ..read.rank_facts import ExitRecord, ProcessFacts, merge_facts
from ..read.rank_process import RankProcess
from ..read.reader import ReadResult
from .kinds import MembershipSource
from .split_groups import rename_split_group, split_group_key

__all__ = ["Job", "ProcessGroup", "build_job", "group_label"]


def group_label(name: str, desc: str) -> str:
    """A group as people know it, the one way every output names it: its desc with its name
    (``EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP (93)``) when the desc says more than the numeric
    name, else the name."""
    if desc and desc not in ("undefined", name):
        return f"{desc} ({name})" if name else desc
    return name or desc or "?"


@dataclass(slots=True)
class ProcessGroup:
    """A process group of the job, the same object whatever local slot each rank gave it."""

    name: str
    desc: str
    ranks: tuple[int, ...]  # global ranks, sorted
    membership: MembershipSource
    local_ids: dict[int, int] = field(default_factory=dict)  # global rank -> its local pg_id
    has_p2p: bool = False  # send/recv seen: pg_status then mixes p2p and collective counters
    recorded_name: str = ""  # the name the dumps use, when ``name`` had to add the members to be unique

    @property
    def label(self) -> str:
        """Human name (:func:`group_label`)."""
        return group_label(self.name, self.desc)


@dataclass(slots=True)
class Job:
    """All ranks' dumps, tied together."""

    dumps: dict[int, RankDump]
    groups: dict[str, ProcessGroup]
    world_size: int | None
    world_size_source: str  # "pg_config", "host_map", "inferred" or "unknown"
    missing_ranks: tuple[int, ...]
    problems: list[str]
    unnamed_local_ids: dict[int, tuple[int, ...]]  # rank -> pg_status ids we could not name
    processes: dict[int, RankProcess] = field(default_factory=dict)  # rank -> where it ran, when known
    last_heard: dict[int, int] = field(default_factory=dict)  # rank -> when it last reached the store (wall ns)
    last_step: dict[int, int] = field(default_factory=dict)  # rank -> its training step then
    store_host: str | None = None  # the host that runs the job's store, when known
    network: NetworkFacts | None = None  # the store and other hosts, as the analysing node saw them
    #: Every node's view, when the folders of several nodes of the incident were read together.
    network_views: tuple[NetworkFacts, ...] = ()
    #: The verdict the live incident wrote (incident.json's ``summary``, untrusted) and that file's path.
    recorded: dict[str, Any] = field(default_factory=dict)
    recorded_from: str = ""
    #: rank -> what /proc showed of its process at incident time (a host-mate's read; the newest), and how
    #: ranks that left said they left: the evidence for a culprit's cause (:mod:`.cause`).
    host_facts: dict[int, ProcessFacts] = field(default_factory=dict)
    exits: dict[int, ExitRecord] = field(default_factory=dict)
    _progress: dict[tuple[int, str], Progress | None] = field(default_factory=dict)
    _first_enqueue: dict[tuple[str, int], int | None] = field(default_factory=dict)

    @property
    def hosts(self) -> dict[int, str]:
        """Rank -> the host it ran on, where any source says."""
        return {r: p.host for r, p in self.processes.items() if p.host}

    @property
    def latest_ns(self) -> int:
        """The newest enqueue or completion time any dump records; 0 when none records a time."""
        return max((d.latest_ns for d in self.dumps.values()), default=0)

    @property
    def backends(self) -> set[str]:
        return {d.backend for d in self.dumps.values()}

    def entries_at(self, rank: int, group: str, seq: int) -> list[Entry]:
        """The rank's collective entries with ``collective_seq_id == seq`` in ``group``.

        The newest and in-flight entries are at hand (the dump's tail); older ones
        load the rank's full dump.
        """
        dump = self.dumps.get(rank)
        if dump is None:
            return []
        found = [e for e in dump.tail if e.pg_name == group and e.collective_seq_id == seq and not e.is_p2p]
        if found:
            return found
        h = dump.histories.get(group)
        if h is None or h.position(seq) is None:
            return []
        return [e for e in dump.entries if e.pg_name == group and e.collective_seq_id == seq and not e.is_p2p]

    def op_at(self, ranks: tuple[int, ...], group: str, seq: int) -> str | None:
        """The call (``nccl:all_reduce``) at ``group`` #``seq`` as the first of ``ranks`` that
        recorded it says: from its tail, else its columns; never loads a full dump."""
        for rank in ranks:
            dump = self.dumps.get(rank)
            if dump is None:
                continue
            for e in dump.tail:
                if e.pg_name == group and e.collective_seq_id == seq and not e.is_p2p:
                    return e.profiling_name
            h = dump.histories.get(group)
            i = h.position(seq) if h is not None else None
            fp = dump.fingerprints.get(h.fingerprint[i]) if h is not None and i is not None else None
            if fp:
                return (f"{dump.backend}:" if dump.backend not in ("", "unknown") else "") + str(fp[0])
        return None

    def first_enqueue(self, group: str, seq: int) -> int | None:
        """When any rank first enqueued ``group`` #``seq`` (from the columns); None if none recorded it.

        Every member finished #``seq - 1`` by then, give or take (a collective completes on
        all ranks together): the bound on a guessed end in :func:`fr_otel.read.dump.op_interval`.
        """
        key = (group, seq)
        if key not in self._first_enqueue:
            self._first_enqueue[key] = self._compute_first_enqueue(group, seq)
        return self._first_enqueue[key]

    def _compute_first_enqueue(self, group: str, seq: int) -> int | None:
        pg = self.groups.get(group)
        first = None
        for rank in pg.ranks if pg is not None else ():
            dump = self.dumps.get(rank)
            h = dump.histories.get(group) if dump is not None else None
            i = h.position(seq) if h is not None else None
            if h is None or i is None:
                continue
            created = h.created_ns[i]
            if created > 0 and (first is None or created < first):
                first = created
        return first

    def ordered_groups(self) -> list[ProcessGroup]:
        """Groups in creation order (numeric names), then by name."""
        return sorted(self.groups.values(), key=_order_key)

    def progress(self, rank: int, group: str) -> Progress | None:
        """How far ``rank`` enqueued and completed collectives of ``group``; None if unknown.

        ``pg_status`` is authoritative except in groups that carry send/recv, whose
        counters mix p2p and collective sequence numbers; entries fill the gaps.
        """
        key = (rank, group)
        if key not in self._progress:
            self._progress[key] = self._compute_progress(rank, group)
        return self._progress[key]

    def _compute_progress(self, rank: int, group: str) -> Progress | None:
        pg = self.groups[group]
        dump = self.dumps.get(rank)
        if dump is None:
            return None
        h = dump.histories.get(group)
        seqs = h.seq if h is not None else ()
        local_id = pg.local_ids.get(rank)
        status = dump.pg_status.get(local_id) if local_id is not None else None
        from_entries = _progress_from_entries(h) if h is not None and seqs else None
        if status is not None and not pg.has_p2p:
            if from_entries is None:
                return status
            # Gloo sets last_completed from a worker thread after wait() returned, so it can
            # lag (even go backwards); the retired entries are the better witness then.
            return status._replace(
                enqueued=max(status.enqueued, from_entries.enqueued),
                completed=max(status.completed, from_entries.completed),
            )
        return from_entries


def _processes(dumps: dict[int, RankDump], side: dict[int, RankProcess]) -> dict[int, RankProcess]:
    """Where each rank ran: what its dump says (the agent's payload), else the files beside the
    dumps (the host map, ranks.json: ranks without a dump too), else the host in its file
    name (``nccl_trace_rank_node02_5``)."""
    out: dict[int, RankProcess] = dict(side)
    for rank, d in dumps.items():
        known = d.process or side.get(rank)
        host = host_from_name(d.path)
        if known is not None and (known.host or host is None):
            out[rank] = known
        elif known is not None:
            out[rank] = replace(known, host=host)
        elif host is not None:
            out[rank] = RankProcess(host=host, source="file name")
    return out


def _progress_from_entries(h: GroupHistory) -> Progress:
    """Progress as the entries show it: completed up to just before the oldest pending one."""
    seqs = h.seq
    if h.contiguous:  # in seq order: the oldest pending op is the first one not completed
        at = h.completed.find(0)
        return Progress(enqueued=seqs[-1], started=-1, completed=seqs[at] - 1 if at >= 0 else seqs[-1])
    pending = list(compress(seqs, map(not_, h.completed)))
    completed = min(pending) - 1 if pending else max(seqs)
    return Progress(enqueued=max(seqs), started=-1, completed=completed)


def _order_key(pg: ProcessGroup) -> tuple[int, str]:
    created = creation_order(pg.recorded_name or pg.name)
    return (1 << 60 if created is None else created, pg.name)


def build_job(read: ReadResult) -> Job:
    """Tie per-rank dumps into one job model (pure data; problems are appended, never raised)."""
    problems = list(read.problems)
    dumps = read.dumps
    world_hint: tuple[int, ...] | None = None
    variants: dict[str, dict[tuple[int, ...], str]] = {}  # name -> member set -> desc
    counted: set[tuple[str, int]] = set()  # each parsed member list once: hashing each rank's is O(N²) at 100k
    for rank, dump in sorted(dumps.items()):
        for name, cfg in dump.pg_config.items():
            if not name:
                # gloo (torch 2.13): config recorded before the group had a name; at
                # best it holds the world's ranks.
                if unnamed_world(name, cfg.ranks):
                    world_hint = cfg.ranks
                continue
            if cfg.ranks and (name, id(cfg.ranks)) not in counted:
                counted.add((name, id(cfg.ranks)))
                variants.setdefault(name, {}).setdefault(cfg.ranks, cfg.desc)
    configs: dict[str, tuple[str, tuple[int, ...]]] = {}
    recorded: dict[str, str] = {}
    for name, sets in variants.items():
        if len(sets) == 1:
            (ranks, desc), = sets.items()
            configs[name] = (desc, ranks)
            continue
        # One name, several member sets (user-named split groups, older torch): distinct
        # groups, as PyTorch's analyzer keys them (name + members); never merged.
        for ranks, desc in sets.items():
            key = split_group_key(name, ranks)
            configs[key] = (desc, ranks)
            recorded[key] = name
        rename_split_group(name, sets, dumps, problems)

    groups: dict[str, ProcessGroup] = {
        name: ProcessGroup(name=name, desc=desc, ranks=ranks, membership=MembershipSource.PG_CONFIG,
                           recorded_name=recorded.get(name, name))
        for name, (desc, ranks) in configs.items()
    }
    _add_inferred_groups(groups, dumps, problems)
    world_size, source = _world_size(groups, dumps, world_hint, read.side.world_size)
    _complete_default_group(groups, world_size)
    unnamed = _pair_local_ids(groups, dumps, problems)
    missing: tuple[int, ...] = ()
    if world_size is not None:
        missing = tuple(r for r in range(world_size) if r not in dumps)
        if missing:
            problems.append(f"no dump for rank(s) {compress_ranks(missing)} of {world_size}")
    processes = _processes(dumps, read.side.processes)
    return Job(
        dumps=dumps,
        groups=groups,
        world_size=world_size,
        world_size_source=source,
        missing_ranks=missing,
        problems=problems,
        unnamed_local_ids=unnamed,
        processes=processes,
        last_heard=dict(read.side.last_heard),
        last_step=dict(read.side.last_step),
        store_host=read.side.store_host or (read.side.network.store_host if read.side.network else None),
        network=read.side.network,
        network_views=read.side.views,
        recorded=read.side.identity.summary if read.side.identity is not None else {},
        recorded_from=read.side.identity.path if read.side.identity is not None else "",
        host_facts=_host_facts(dumps, read.side.identity.host if read.side.identity is not None else {}, processes),
        exits={**(read.side.identity.exits if read.side.identity is not None else {}),
               **{r: d.exit for r, d in dumps.items() if d.exit is not None}},
    )


def _host_facts(dumps: dict[int, RankDump], written: dict[int, ProcessFacts],
                processes: dict[int, RankProcess]) -> dict[int, ProcessFacts]:
    """Per rank, the newest read of its process among every dump's host view and the incident file's. A dump
    speaks only for its own host's ranks (where both hosts are known): a forged view cannot name another's."""
    out = dict(written)
    for d in dumps.values():
        here = processes[d.rank].host if d.rank in processes else None
        for rank, facts in d.host_view.items():
            there = processes[rank].host if rank in processes else None
            if here and there and here != there:
                continue
            out[rank] = merge_facts(out.get(rank), facts)
    return out


def _add_inferred_groups(groups: dict[str, ProcessGroup], dumps: dict[int, RankDump], problems: list[str]) -> None:
    members: dict[str, set[int]] = {}
    for rank, dump in dumps.items():
        for name, h in dump.histories.items():
            members.setdefault(name, set()).add(rank)
            pg = groups.get(name)
            if pg is None:
                pg = groups[name] = ProcessGroup(name=name, desc=h.desc, ranks=(),
                                                 membership=MembershipSource.ENTRIES)
            if h.p2p_count:
                pg.has_p2p = True
            pg.local_ids[rank] = h.local_id
    for name, pg in groups.items():
        seen = members.get(name, set())
        if pg.membership == MembershipSource.ENTRIES:
            pg.ranks = tuple(sorted(seen))
        elif not seen <= set(pg.ranks):
            extra = sorted(seen - set(pg.ranks))
            problems.append(
                f"group {name}: rank(s) {compress_ranks(extra)} recorded collectives in it but pg_config "
                "does not list them; counting them as members"
            )
            pg.ranks = tuple(sorted(set(pg.ranks) | seen))


def _world_size(
    groups: dict[str, ProcessGroup], dumps: dict[int, RankDump], world_hint: tuple[int, ...] | None,
    host_map_world: int | None,
) -> tuple[int | None, str]:
    default = _default_group(groups)
    if default is not None and default.membership == MembershipSource.PG_CONFIG:
        return len(default.ranks), "pg_config"
    if world_hint:
        return len(world_hint), "pg_config"
    if host_map_world:  # the agents' host map, written at start-up: ranks that left no dump count too
        return host_map_world, "host_map"
    seen = set(dumps)
    for pg in groups.values():
        seen.update(pg.ranks)
    if not seen:
        return None, "unknown"
    return max(seen) + 1, "inferred"


def _default_group(groups: dict[str, ProcessGroup]) -> ProcessGroup | None:
    for pg in groups.values():
        if is_default_group(pg.name, pg.desc):
            return pg
    return groups.get("0")


def _complete_default_group(groups: dict[str, ProcessGroup], world_size: int | None) -> None:
    """The default group holds every rank, even those with no entries in it (or no dump)."""
    default = _default_group(groups)
    if (default is not None and world_size is not None
            and default.membership != MembershipSource.PG_CONFIG):
        default.ranks = tuple(range(world_size))
        default.membership = MembershipSource.WORLD


def _pair_local_ids(
    groups: dict[str, ProcessGroup], dumps: dict[int, RankDump], problems: list[str]
) -> dict[int, tuple[int, ...]]:
    """Name every pg_status slot: from entries, else by creation order (checked)."""
    unnamed: dict[int, tuple[int, ...]] = {}
    orderable = all(creation_order(pg.recorded_name or pg.name) is not None for pg in groups.values())
    by_rank: dict[int, list[ProcessGroup]] = {}
    for pg in groups.values():
        for r in pg.ranks:
            by_rank.setdefault(r, []).append(pg)
    for rank, dump in dumps.items():
        known = {pg.local_ids[rank]: pg.name for pg in by_rank.get(rank, []) if rank in pg.local_ids}
        slots = sorted(set(dump.pg_status) | set(known))
        todo = [s for s in slots if s not in known]
        if not todo:
            continue
        member_of = by_rank.get(rank, [])
        if orderable and len(member_of) == len(slots):
            ordered = sorted(member_of, key=lambda pg: creation_order(pg.recorded_name or pg.name) or 0)
            pairing = dict(zip(slots, ordered))
            if all(pairing[s].name == n for s, n in known.items()):
                for slot, pg in pairing.items():
                    pg.local_ids.setdefault(rank, slot)
                continue
        unnamed[rank] = tuple(todo)
        busy = [s for s in todo if dump.pg_status[s].enqueued != dump.pg_status[s].completed]
        if busy:
            problems.append(
                f"{dump.path}: cannot tell which group local id(s) {', '.join(map(str, busy))} "
                "belong to (no entries name them and pg_config does not pin them down)"
            )
    return unnamed
