"""Who waits for whom: the cross-group wait graph and its culprits.

Within a group, a rank with a collective in flight waits for every member that
has not enqueued it; a pending send/recv waits for the peer that never posted its
counterpart (edges added by :mod:`fr_otel.diagnosis.p2p`). Edges go through (group, seq, why) hubs, so N waiters on M
laggards cost N + M edges, not N × M. Culprits are the ranks in *sink*
components that someone waits on: waited for, and waiting for no one (a cycle of
ranks waiting on each other is a sink too: collectives issued in different
orders). A rank that enqueued a collective its peers completed, but did not
complete it itself, is evidence on its own (its device or network stalled).

A collective every member entered (or a send/recv both sides posted) that none
finished is a *mutual* hub: it blames no one, unless one of its members is a proven
cause (its device stalled, or it called something else there): then the hub points
at that member, and everyone inside waits on it (:meth:`WaitGraph.explain_mutual`).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterator, TypeAlias

from ..common.ranks import compress_ranks
from ..read.dump import Progress
from .job import Job
from .kinds import CulpritKind
from .pace import Clock
from .verdict import Evidence, GroupState

__all__ = ["WaitGraph", "add_waits"]

#: A send/recv hub's call (``nccl:send 0->1``), or each rank's own for a transfer both sides posted.
Call: TypeAlias = "str | dict[int, str] | None"


class WaitGraph:
    """Ranks and (group, seq, why) hubs: rank -> hub -> ranks it waits on (O(n) edges)."""

    def __init__(self) -> None:
        self.edges: dict[Any, set[Any]] = {}
        # hub -> (kind, describe(culprit, waiting ranks text))
        # hub -> (kind, describe, call): the call one string, or per rank (a send/recv pair's two sides)
        self.hubs: dict[tuple[str, int | None, str], tuple[CulpritKind, Callable[[int, str], str], Call]] = {}
        self.mutual_hubs: set[Any] = set()
        self._mutual_notes: dict[Any, str] = {}  # mutual hub -> why no rank can be singled out
        # Proven causes (own device or network stalled; called a different op): what they in
        # turn wait on is a consequence, so their outgoing edges do not make them less of a cause.
        self.stalled: set[int] = set()
        self.since: dict[Any, int] = {}  # hub -> when its first waiter began waiting there (epoch ns, where known)

    @property
    def unexplained(self) -> list[str]:
        """Why no rank can be singled out, per mutual hub still unexplained."""
        return [self._mutual_notes[h] for h in self._mutual_notes if h in self.mutual_hubs]

    def add_mutual(self, waiter: int, others: list[int], hub: tuple[str, int | None, str], inside: str,
                   note: str, op: Call = None) -> None:
        """``waiter`` and ``others`` are all inside one collective or transfer (``inside``) none finished;
        ``op``: a transfer's calls, per rank."""
        self.add(waiter, hub, others, CulpritKind.NOT_COMPLETED,
                 lambda q, w: f"rank(s) {w} wait in {inside}, which rank {q} never finishes", op)
        self.mutual_hubs.add(hub)
        self._mutual_notes[hub] = note

    def explain_mutual(self, roots: set[int]) -> None:
        """A mutual hub holding a proven cause waits on that cause alone (a cascade, not a mystery)."""
        for hub in list(self.mutual_hubs):
            inside = {w for w, hubs in self.edges.items() if isinstance(w, int) and hub in hubs}
            causes = inside & roots
            if causes:
                self.edges[hub] = causes
                self.mutual_hubs.discard(hub)
                for c in causes:  # a cause does not wait on itself
                    self.edges[c].discard(hub)

    def waiters(self, hub: Any) -> list[int]:
        return sorted(w for w, hubs in self.edges.items() if isinstance(w, int) and hub in hubs)

    def reaching(self, targets: set[int]) -> dict[int, set[int]]:
        """For every rank that waits, directly or through others, on any of ``targets``: which."""
        back: dict[Any, set[Any]] = {}
        for node, outs in self.edges.items():
            for nxt in outs:
                back.setdefault(nxt, set()).add(node)
        out: dict[int, set[int]] = {}
        for t in targets:
            seen, todo = {t}, [t]
            while todo:
                for prev in back.get(todo.pop(), ()):
                    if prev not in seen:
                        seen.add(prev)
                        todo.append(prev)
                        if isinstance(prev, int) and prev != t:
                            out.setdefault(prev, set()).add(t)
        return out

    def add(
        self, waiter: int, hub: tuple[str, int | None, str], targets: list[int], kind: CulpritKind,
        describe: Callable[[int, str], str], op: Call = None, since_ns: int | None = None,
    ) -> None:
        """``waiter`` waits (through ``hub``) on ``targets``, since ``since_ns`` where known; ``op`` names a
        send/recv hub's call."""
        if since_ns:
            self.since[hub] = min(self.since.get(hub, since_ns), since_ns)
        self.edges.setdefault(waiter, set()).add(hub)
        self.edges.setdefault(hub, set()).update(targets)
        for t in targets:
            self.edges.setdefault(t, set())
        self.hubs.setdefault(hub, (kind, describe, op))

    def evidence_for(self, rank: int) -> list[Evidence]:
        out = []
        for hub, (kind, describe, op) in self.hubs.items():
            targets = self.edges[hub]
            if rank in targets and hub not in self.mutual_hubs:
                waiters = tuple(sorted(w for w, hubs in self.edges.items() if isinstance(w, int) and hub in hubs))
                text = describe(rank, compress_ranks(waiters))
                peer = waiters[0] if op is not None and len(waiters) == 1 else None
                call = op.get(rank) if isinstance(op, dict) else op
                out.append(Evidence(kind, hub[0], hub[1], text, waiters, len(targets) == 1, op=call, peer=peer,
                                    p2p=op is not None, since_ns=self.since.get(hub)))
        return out

    def culprits(self) -> tuple[list[int], list[str]]:
        """Ranks in sink components that someone waits on; notes about cycles."""
        notes: list[str] = []
        blamed: list[int] = []
        # Waited on through a mutual hub (all inside one collective or transfer) blames no one.
        waited_on_anywhere = {
            t for hub, targets in self.edges.items()
            if isinstance(hub, tuple) and hub not in self.mutual_hubs for t in targets
        }
        edges = {n: (set() if n in self.stalled else out) for n, out in self.edges.items()}
        for comp in _sink_components(edges):
            ranks = sorted(n for n in comp if isinstance(n, int))
            hubs = [n for n in comp if isinstance(n, tuple)]
            waited_on = [r for r in ranks if r in waited_on_anywhere]
            if not waited_on:
                continue
            if hubs and all(h in self.mutual_hubs for h in hubs):
                continue  # everyone inside one collective: a note, not a culprit
            if len(waited_on) > 1 and hubs:
                notes.append(
                    f"ranks {compress_ranks(ranks)} wait for each other in a cycle "
                    "(collectives issued in different orders on different groups)"
                )
            blamed.extend(waited_on)
        return blamed, notes


def _sink_components(edges: dict[Any, set[Any]]) -> list[list[Any]]:
    """Strongly connected components with no edge leaving them (iterative Tarjan)."""
    index: dict[Any, int] = {}
    low: dict[Any, int] = {}
    on_stack: set[Any] = set()
    stack: list[Any] = []
    comps: list[list[Any]] = []
    comp_of: dict[Any, int] = {}
    counter = 0
    for root in edges:
        if root in index:
            continue
        work: list[tuple[Any, Iterator[Any]]] = [(root, iter(edges.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges.get(nxt, ()))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    comp_of[n] = len(comps)
                    comp.append(n)
                    if n == node:
                        break
                comps.append(comp)
    sinks = []
    for i, comp in enumerate(comps):
        if all(comp_of[t] == i for n in comp for t in edges.get(n, ())):
            sinks.append(comp)
    return sinks


def add_waits(job: Job, state: GroupState, graph: WaitGraph, evidence: dict[int, list[Evidence]],
              clock: Clock) -> None:
    """Each member's wait in its oldest collective in flight, if that wait is old enough to be a
    stall (``clock``): a younger one is the job at work, not evidence against anyone."""
    pg = state.group
    if pg.has_p2p or len(pg.ranks) < 2:
        return
    known = {r: p for r, p in state.progress.items() if p is not None}
    unknown = [r for r, p in state.progress.items() if p is None]
    label = pg.label
    # Who is behind depends on the sequence number only, and thousands of waiters share one:
    # each list is computed once per (question, seq), not once per waiter (O(N^2) at 16k ranks).
    memo: dict[tuple[str, int], list[int]] = {}
    laggards_dumped: dict[int, int | None] = {}  # seq -> the earliest dump among those who never enqueued it

    def ranks_where(question: str, seq: int) -> list[int]:
        found = memo.get((question, seq))
        if found is None:
            tests: dict[str, Callable[[Progress], bool]] = {
                "enqueued_before": lambda pq: pq.enqueued < seq, "completed": lambda pq: pq.completed >= seq,
                "behind": lambda pq: pq.completed < seq - 1}
            test = tests[question]
            found = memo[(question, seq)] = [q for q, pq in known.items() if test(pq)]
        return found

    for r, p in sorted(known.items()):
        if p.completed >= p.enqueued or _silent(job, r):
            continue  # a silent rank's record is what it was in before it went silent, not where it waits now
        seq = p.completed + 1
        op = _op_at(job, r, pg.name, seq)
        inside = f"{op} #{seq} on {label}"
        created = _created_at(job, r, pg.name, seq)

        laggards = ranks_where("enqueued_before", seq)
        if seq not in laggards_dumped:
            # A laggard dumped early bounds how long the wait had lasted by then; one that has left (its exit
            # record: an exit, an exception, SIGTERM) never enqueues it, whenever its last recorder was taken; nor
            # does one that went silent (only its last record on its node speaks for it: stopped, its GIL held,
            # or dead, it sent nothing within the incident's budget).
            laggards_dumped[seq] = clock.earliest(q for q in laggards if q not in job.exits and not _silent(job, q))
        if not clock.stuck(created, r, laggards_dumped[seq], what=inside):
            continue
        if laggards:
            graph.add(r, (pg.name, seq, "enq"), laggards, CulpritKind.NOT_ENQUEUED,
                      partial(lambda inside, q, w: f"rank(s) {w} wait in {inside}; rank {q} never "
                      f"enqueued it (its last on this group is #{known[q].enqueued}{_record_note(job, q)})", inside),
                      since_ns=created)
            continue
        if unknown:
            missing = [q for q in unknown if q not in job.dumps]
            silent = [q for q in unknown if q in job.dumps]
            if missing:
                graph.add(r, (pg.name, seq, "missing"), missing, CulpritKind.MISSING_DUMP,
                          partial(lambda inside, q, w: f"rank(s) {w} wait in {inside}; there is no dump "
                          f"from rank {q}, a member of the group", inside))
            if silent:
                graph.add(r, (pg.name, seq, "silent"), silent, CulpritKind.NOT_ENQUEUED,
                          partial(lambda inside, q, w: f"rank(s) {w} wait in {inside}; rank {q}'s dump "
                          "holds no record of this group", inside))
            continue
        completers = ranks_where("completed", seq)
        if completers:
            evidence.setdefault(r, []).append(Evidence(
                CulpritKind.NOT_COMPLETED, pg.name, seq,
                f"rank {r} enqueued {inside} but completed only #{p.completed}, while rank(s) "
                f"{compress_ranks(completers)} completed it: its device or network stalled",
                (), True, True))
            continue
        behind = ranks_where("behind", seq)
        if behind:
            graph.add(r, (pg.name, seq, "behind"), behind, CulpritKind.NOT_COMPLETED,
                      partial(lambda inside, q, w: f"rank(s) {w} wait in {inside}; rank {q} has not "
                      f"completed #{known[q].completed + 1}", inside))
            continue
        # Every member entered and none completed: the fault is inside this collective.
        graph.add_mutual(
            r, [q for q in known if q != r], (pg.name, seq, "all"), inside,
            f"group {label}: all {len(known)} ranks entered {op} #{seq} and none completed it; "
            "the fault is inside the collective (device or network) and the recorder cannot single out a rank")


def _silent(job: Job, rank: int) -> bool:
    """It sent nothing: its dump is its last record on its node (:mod:`fr_otel.read.last_record`)."""
    dump = job.dumps.get(rank)
    return dump is not None and dump.record is not None


def _record_note(job: Job, rank: int) -> str:
    """``, by its last record, 0.6 s before it stopped answering`` for a rank that sent nothing; else nothing."""
    dump = job.dumps.get(rank)
    return f", by {dump.record.said()}" if dump is not None and dump.record is not None else ""


def _created_at(job: Job, rank: int, group: str, seq: int) -> int | None:
    """When ``rank`` enqueued ``group`` #``seq`` (from its columns), None if its ring lost it."""
    dump = job.dumps.get(rank)
    h = dump.histories.get(group) if dump is not None else None
    i = h.position(seq) if h is not None else None
    if h is not None and i is not None:
        return h.created_ns[i]
    found = job.entries_at(rank, group, seq)
    return found[0].time_created_ns if found else None


def _op_at(job: Job, rank: int, group: str, seq: int) -> str:
    found = job.entries_at(rank, group, seq)
    return found[0].op if found else "collective"
