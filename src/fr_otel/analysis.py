"""Cross-rank analysis: who are the others waiting for, and why do we think so.

Blame is a graph question. Within each process group a rank with a collective
in flight *waits for* every member that has not enqueued it yet. Across groups
those waits chain (a rank missing from the world all_reduce may itself be
stuck waiting for someone in its tensor-parallel group), so the culprits are
the ranks at the end of the chains: waited for, and waiting for no one. Added
to them: ranks that enqueued a collective their peers completed but did not
complete it (their device or network stalled), the minority of a mismatch
(same sequence number, different op / sizes / dtypes), and, when nothing hangs,
a rank that consistently enqueues last (a straggler). Everything here returns
data; printing is the CLI's job.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from .dump import Entry, Frame, Progress
from .job import Job, ProcessGroup
from .ranks import compress_ranks

__all__ = ["DEFAULT_STRAGGLER_THRESHOLD_S", "Culprit", "GroupState", "Verdict", "AnalysisOptions", "analyze", "KIND_ORDER"]

# Strongest evidence first: one record per rank keeps its strongest kind.
KIND_ORDER = ("mismatch", "not_completed", "not_enqueued", "missing_dump", "straggler")


DEFAULT_STRAGGLER_THRESHOLD_S = 0.05


@dataclass(frozen=True, slots=True)
class AnalysisOptions:
    """Knobs of the analysis (defaults suit real jobs)."""

    straggler_threshold_s: float = DEFAULT_STRAGGLER_THRESHOLD_S  # median enqueue lateness that makes a straggler
    straggler_min_collectives: int = 5
    straggler_window: int = 256  # most recent collectives per group to judge skew on


@dataclass(frozen=True, slots=True)
class Evidence:
    """One reason to suspect a rank: what it did (not) do, where."""

    kind: str
    group: str  # group name
    seq: int | None
    text: str
    waiting: tuple[int, ...] = ()  # ranks directly waiting on this one here
    sole: bool = False  # the only rank the waiting ranks wait for here
    direct: bool = False  # seen in the rank's own state, not inferred from who waits on it


@dataclass(frozen=True, slots=True)
class Culprit:
    """A rank the others wait for, with its strongest evidence first."""

    rank: int
    kind: str
    group_name: str
    group_desc: str
    collective_seq_id: int | None
    evidence: str
    op: str | None
    waiting_ranks: tuple[int, ...]
    last_frame: Frame | None
    related: tuple[Evidence, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "kind": self.kind,
            "process_group": {"name": self.group_name, "desc": self.group_desc},
            "collective_seq_id": self.collective_seq_id,
            "evidence": self.evidence,
            "op": self.op,
            "waiting_ranks": list(self.waiting_ranks),
            "last_frame": self.last_frame._asdict() if self.last_frame else None,
            "related": [
                {"kind": e.kind, "process_group": e.group, "collective_seq_id": e.seq, "evidence": e.text,
                 "waiting_ranks": list(e.waiting)}
                for e in self.related
            ],
        }


@dataclass(slots=True)
class InFlight:
    """The oldest collective of a group that some member has not completed."""

    seq: int
    op: str | None
    since_ns: int | None  # earliest enqueue among the ranks that entered it
    entered: tuple[int, ...]
    not_entered: tuple[int, ...]
    timeout_ms: int | None


@dataclass(slots=True)
class GroupState:
    """Per group: how far each member enqueued and completed, and what is in flight."""

    group: ProcessGroup
    progress: dict[int, Progress | None]
    in_flight: InFlight | None = None
    note: str | None = None

    def to_dict(self, latest_ns: int | None) -> dict[str, Any]:
        known = {r: p for r, p in self.progress.items() if p is not None}
        out: dict[str, Any] = {
            "name": self.group.name,
            "desc": self.group.desc,
            "size": len(self.group.ranks),
            "membership": self.group.membership,
            "max_enqueued": max((p.enqueued for p in known.values()), default=None),
            "min_enqueued": min((p.enqueued for p in known.values()), default=None),
            "max_completed": max((p.completed for p in known.values()), default=None),
            "min_completed": min((p.completed for p in known.values()), default=None),
            "unknown_ranks": sorted(r for r, p in self.progress.items() if p is None),
            "note": self.note,
            "in_flight": None,
        }
        if self.in_flight is not None:
            f = self.in_flight
            out["in_flight"] = {
                "collective_seq_id": f.seq,
                "op": f.op,
                "since_ns": f.since_ns,
                "age_s": (latest_ns - f.since_ns) / 1e9 if latest_ns and f.since_ns else None,
                "entered": list(f.entered),
                "not_entered": list(f.not_entered),
                "timeout_ms": f.timeout_ms,
            }
        return out


@dataclass(slots=True)
class Verdict:
    """The answer: one word, the culprits with evidence, and what limited it."""

    verdict: str  # hang | desync | straggler | healthy | inconclusive
    culprits: list[Culprit]
    ranks_loaded: int
    world_size: int | None
    problems: list[str]
    notes: list[str] = field(default_factory=list)
    groups: list[GroupState] = field(default_factory=list)
    missing_ranks: tuple[int, ...] = ()
    reference_ns: int | None = None  # "now" for ages: when the dumps were written, if known
    reference_source: str = "none"  # "dump_files" | "latest_activity" | "none"
    backends: tuple[str, ...] = ()

    def to_dict(self, *, include_groups: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "culprits": [c.to_dict() for c in self.culprits],
            "ranks_loaded": self.ranks_loaded,
            "world_size": self.world_size,
            "problems": list(self.problems),
            "notes": list(self.notes),
            "missing_ranks": list(self.missing_ranks),
            "backends": list(self.backends),
            "reference_ns": self.reference_ns,
            "reference_source": self.reference_source,
        }
        if include_groups:
            out["groups"] = [g.to_dict(self.reference_ns) for g in self.groups]
        return out


# ---------------------------------------------------------------------------
# Entry points


def analyze(job: Job, options: AnalysisOptions | None = None) -> Verdict:
    """Name the culprit ranks of ``job``, with evidence; pure function of the dumps."""
    options = options or AnalysisOptions()
    reference, reference_source = _reference_time(job)
    states = [_group_state(job, pg) for pg in _ordered_groups(job)]
    notes: list[str] = [s.note for s in states if s.note and s.in_flight is not None]
    evidence: dict[int, list[Evidence]] = {}

    mismatch = _mismatches(job)
    for rank, ev in mismatch:
        evidence.setdefault(rank, []).append(ev)

    graph = _WaitGraph()
    for state in states:
        _add_waits(job, state, graph, evidence)
    culprits_from_graph, cycle_notes = graph.culprits()
    notes.extend(cycle_notes)
    blamed = set(culprits_from_graph) | {r for r, evs in evidence.items() if any(e.kind == "not_completed" for e in evs)}
    for rank in culprits_from_graph:
        evidence.setdefault(rank, []).extend(graph.evidence_for(rank))

    hang_culprits = {r for r in blamed}
    mismatch_culprits = {r for r, _ in mismatch}
    chosen = hang_culprits | mismatch_culprits
    stuck = any(s.in_flight is not None and s.in_flight.seq is not None for s in states if _stalled(s))
    verdict: str
    if mismatch_culprits:
        verdict = "desync"
    elif hang_culprits:
        verdict = "hang"
    elif stuck or graph.unexplained:
        verdict = "inconclusive"
        notes.extend(graph.unexplained)
    else:
        stragglers = _stragglers(job, options)
        for rank, ev in stragglers:
            evidence.setdefault(rank, []).append(ev)
        chosen = {r for r, _ in stragglers}
        verdict = "straggler" if chosen else "healthy"
    if len(job.dumps) < 2 and verdict in ("healthy", "straggler"):
        verdict = "inconclusive"
        notes.append("fewer than two ranks' dumps: nothing to compare across ranks")
    if verdict in ("healthy", "inconclusive") and "gloo" in job.backends and not chosen:
        notes.append("gloo records no send/recv: a hang in point-to-point ops would not show in these dumps")
    if verdict == "inconclusive" and not notes:
        notes.append("no rank is waiting on another in the recorded collectives")

    culprits = [_culprit(job, rank, evidence[rank]) for rank in sorted(chosen)]
    culprits.sort(key=lambda c: (KIND_ORDER.index(c.kind), c.rank))
    return Verdict(
        verdict=verdict,
        culprits=culprits,
        ranks_loaded=len(job.dumps),
        world_size=job.world_size,
        problems=list(job.problems),
        notes=_dedupe(notes),
        groups=states,
        missing_ranks=job.missing_ranks,
        reference_ns=reference,
        reference_source=reference_source,
        backends=tuple(sorted(job.backends)),
    )


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _stalled(state: GroupState) -> bool:
    """In flight and someone is not through it: not just a snapshot of a finished op."""
    f = state.in_flight
    return f is not None and state.note is None


def _ordered_groups(job: Job) -> list[ProcessGroup]:
    return sorted(job.groups.values(), key=lambda pg: (int(pg.name) if pg.name.isdigit() else 1 << 60, pg.name))


_DAY_NS = 86_400 * 10**9


def _reference_time(job: Job) -> tuple[int | None, str]:
    """The moment ages are measured to. Dumps carry no timestamp of their own: a file
    written within a day after the last recorded activity dates it (fresh dumps);
    otherwise (copied files) fall back to the newest recorded activity."""
    latest = 0
    for dump in job.dumps.values():
        for e in dump.entries[-64:]:  # entries are in record order; the tail holds the newest
            latest = max(latest, e.time_created_ns, e.time_completed_ns or 0)
    if not latest:
        return None, "none"
    written = [d.file_mtime_ns for d in job.dumps.values() if d.file_mtime_ns]
    if written and 0 <= min(written) - latest <= _DAY_NS:
        return min(written), "dump_files"
    return latest, "latest_activity"


# ---------------------------------------------------------------------------
# Per-group progress and in-flight collective


def _group_state(job: Job, pg: ProcessGroup) -> GroupState:
    progress = {r: job.progress(r, pg.name) for r in pg.ranks}
    state = GroupState(group=pg, progress=progress)
    if pg.has_p2p:
        state.note = (
            f"group {pg.label} carries send/recv: its progress counters mix p2p and collective "
            "sequence numbers, so it is not compared across ranks"
        )
    known = {r: p for r, p in progress.items() if p is not None}
    pending = [p.completed + 1 for p in known.values() if p.completed < p.enqueued]
    if not pending:
        return state
    seq = min(pending)
    entered = tuple(sorted(r for r, p in known.items() if p.enqueued >= seq and p.completed < seq))
    not_entered = tuple(sorted(r for r in pg.ranks if progress[r] is None or progress[r].enqueued < seq))  # type: ignore[union-attr]
    found = [e for r in entered for e in _entries_at(job, r, pg.name, seq)]
    state.in_flight = InFlight(
        seq=seq,
        op=found[0].op if found else None,
        since_ns=min((e.time_created_ns for e in found), default=None),
        entered=entered,
        not_entered=not_entered,
        timeout_ms=found[0].timeout_ms if found else None,
    )
    return state


def _entries_at(job: Job, rank: int, group: str, seq: int) -> list[Entry]:
    bucket = job.group_entries(rank, group)
    # Entries are in seq order within a group: scan from the end, where in-flight ones are.
    out = []
    for e in reversed(bucket):
        if e.is_p2p:
            continue
        if e.collective_seq_id == seq:
            out.append(e)
        elif e.collective_seq_id < seq:
            break
    return out


# ---------------------------------------------------------------------------
# Who waits for whom


class _WaitGraph:
    """Ranks and (group, seq, why) hubs: rank -> hub -> ranks it waits on (O(n) edges)."""

    def __init__(self) -> None:
        self.edges: dict[Any, set[Any]] = {}
        # hub -> (kind, describe(culprit, waiting ranks text))
        self.hubs: dict[tuple[str, int, str], tuple[str, Callable[[int, str], str]]] = {}
        self.mutual_hubs: set[Any] = set()
        self.unexplained: list[str] = []

    def add(
        self, waiter: int, hub: tuple[str, int, str], targets: list[int], kind: str, describe: Callable[[int, str], str]
    ) -> None:
        self.edges.setdefault(waiter, set()).add(hub)
        self.edges.setdefault(hub, set()).update(targets)
        for t in targets:
            self.edges.setdefault(t, set())
        self.hubs.setdefault(hub, (kind, describe))

    def evidence_for(self, rank: int) -> list[Evidence]:
        out = []
        for hub, (kind, describe) in self.hubs.items():
            targets = self.edges[hub]
            if rank in targets and hub not in self.mutual_hubs:
                waiters = tuple(sorted(w for w, hubs in self.edges.items() if isinstance(w, int) and hub in hubs))
                text = describe(rank, compress_ranks(waiters))
                out.append(Evidence(kind, hub[0], hub[1], text, waiters, len(targets) == 1))
        return out

    def culprits(self) -> tuple[list[int], list[str]]:
        """Ranks in sink components that someone waits on; notes about cycles."""
        notes: list[str] = []
        blamed: list[int] = []
        waited_on_anywhere = {t for hub, targets in self.edges.items() if isinstance(hub, tuple) for t in targets}
        for comp in _sink_components(self.edges):
            ranks = sorted(n for n in comp if isinstance(n, int))
            hubs = [n for n in comp if isinstance(n, tuple)]
            waited_on = [r for r in ranks if r in waited_on_anywhere]
            if not waited_on:
                continue
            if hubs and all(h in self.mutual_hubs for h in hubs):
                continue  # everyone inside one collective: a note, not a culprit
            if len(ranks) > 1 and hubs:
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
        work = [(root, iter(edges.get(root, ())))]
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


def _add_waits(job: Job, state: GroupState, graph: _WaitGraph, evidence: dict[int, list[Evidence]]) -> None:
    pg = state.group
    if pg.has_p2p or len(pg.ranks) < 2:
        return
    known = {r: p for r, p in state.progress.items() if p is not None}
    unknown = [r for r, p in state.progress.items() if p is None]
    label = pg.label
    for r, p in sorted(known.items()):
        if p.completed >= p.enqueued:
            continue
        seq = p.completed + 1
        op = _op_at(job, r, pg.name, seq)
        inside = f"{op} #{seq} on {label}"

        laggards = [q for q, pq in known.items() if pq.enqueued < seq]
        if laggards:
            graph.add(r, (pg.name, seq, "enq"), laggards, "not_enqueued",
                      lambda q, w, inside=inside: f"rank(s) {w} wait in {inside}; rank {q} never "
                      f"enqueued it (its last on this group is #{known[q].enqueued})")
            continue
        if unknown:
            missing = [q for q in unknown if q not in job.dumps]
            silent = [q for q in unknown if q in job.dumps]
            if missing:
                graph.add(r, (pg.name, seq, "missing"), missing, "missing_dump",
                          lambda q, w, inside=inside: f"rank(s) {w} wait in {inside}; there is no dump "
                          f"from rank {q}, a member of the group")
            if silent:
                graph.add(r, (pg.name, seq, "silent"), silent, "not_enqueued",
                          lambda q, w, inside=inside: f"rank(s) {w} wait in {inside}; rank {q}'s dump "
                          "holds no record of this group")
            continue
        completers = [q for q, pq in known.items() if pq.completed >= seq]
        if completers:
            evidence.setdefault(r, []).append(Evidence(
                "not_completed", pg.name, seq,
                f"rank {r} enqueued {inside} but completed only #{p.completed}, while rank(s) "
                f"{compress_ranks(completers)} completed it: its device or network stalled",
                (), True, True))
            continue
        behind = [q for q, pq in known.items() if pq.completed < seq - 1]
        if behind:
            graph.add(r, (pg.name, seq, "behind"), behind, "not_completed",
                      lambda q, w, inside=inside: f"rank(s) {w} wait in {inside}; rank {q} has not "
                      f"completed #{known[q].completed + 1}")
            continue
        # Every member entered and none completed: the fault is inside this collective.
        hub = (pg.name, seq, "all")
        graph.add(r, hub, [q for q in known if q != r], "not_completed", lambda q, w: "")
        graph.mutual_hubs.add(hub)
        graph.unexplained.append(
            f"group {label}: all {len(known)} ranks entered {op} #{seq} and none completed it; "
            "the fault is inside the collective (device or network) and the recorder cannot single out a rank"
        )


def _op_at(job: Job, rank: int, group: str, seq: int) -> str:
    found = _entries_at(job, rank, group, seq)
    return found[0].op if found else "collective"


# ---------------------------------------------------------------------------
# Mismatches


def _fingerprint(e: Entry) -> tuple[Any, ...]:
    """What must agree across ranks for one collective (per-op exceptions for uneven ones)."""
    op = e.op
    if "all_to_all" in op or "alltoall" in op:
        return (op, e.input_dtypes, e.output_dtypes)  # split sizes may differ legitimately
    if op == "gather":
        return (op, e.input_sizes, e.input_dtypes)  # only the root has outputs
    if op == "scatter":
        return (op, e.output_sizes, e.output_dtypes)  # only the root has inputs
    return (op, e.input_sizes, e.input_dtypes, e.output_sizes, e.output_dtypes)


def _describe(fp: tuple[Any, ...]) -> str:
    op, *rest = fp[0] if isinstance(fp[0], tuple) else fp
    sizes = next((x for x in rest if x and isinstance(x[0], tuple)), ())
    dtypes = next((x for x in rest if x and isinstance(x[0], str)), ())
    size_text = ",".join("[" + ",".join(map(str, s)) + "]" for s in sizes) or "[]"
    return f"{op} {size_text} {'/'.join(dtypes)}".strip()


def _rank_fingerprints(entries: list[Entry], intern: dict[Any, int]) -> tuple[int, list[int]] | dict[int, int]:
    """Per seq, one interned fingerprint id. Contiguous seqs -> (first seq, ids) for fast slicing."""
    by_seq: dict[int, Any] = {}
    for e in entries:
        if e.is_p2p:
            continue
        fp = _fingerprint(e)
        seq = e.collective_seq_id
        prev = by_seq.get(seq)
        by_seq[seq] = fp if prev is None else (prev if isinstance(prev[0], tuple) else (prev,)) + (fp,)
    ids = {}
    for seq, fp in by_seq.items():
        fid = intern.get(fp)
        if fid is None:
            fid = intern[fp] = len(intern)
        ids[seq] = fid
    if not ids:
        return ids
    seqs = list(ids)
    first, last = min(seqs), max(seqs)
    if last - first + 1 == len(seqs):
        return first, [ids[s] for s in range(first, last + 1)]
    return ids


def _mismatches(job: Job) -> list[tuple[int, Evidence]]:
    found: list[tuple[int, Evidence]] = []
    intern: dict[Any, int] = {}
    for pg in _ordered_groups(job):
        if len(pg.ranks) < 2:
            continue
        per_rank: dict[int, dict[int, int]] = {}
        spans: dict[int, tuple[int, list[int]]] = {}
        for r in pg.ranks:
            fps = _rank_fingerprints(job.group_entries(r, pg.name), intern)
            if isinstance(fps, tuple):
                spans[r] = fps
            elif fps:
                per_rank[r] = fps
        suspect_seqs = _suspect_seqs(spans, per_rank)
        if not suspect_seqs:
            continue
        lookup = {v: k for k, v in intern.items()}
        first_bad: int | None = None
        bad_count = 0
        for seq in sorted(suspect_seqs):
            at = {}
            for r, (first, ids) in spans.items():
                if first <= seq < first + len(ids):
                    at[r] = ids[seq - first]
            for r, ids_by_seq in per_rank.items():
                if seq in ids_by_seq:
                    at[r] = ids_by_seq[seq]
            if len(set(at.values())) < 2:
                continue
            bad_count += 1
            if first_bad is None:
                first_bad = seq
                found.extend(_blame_mismatch(pg, seq, at, lookup))
        if first_bad is not None and bad_count > 1:
            found = [
                (r, ev if ev.group != pg.name else _with_suffix(ev, f" ({bad_count} sequence numbers differ in all)"))
                for r, ev in found
            ]
    return found


def _with_suffix(ev: Evidence, suffix: str) -> Evidence:
    return Evidence(ev.kind, ev.group, ev.seq, ev.text + suffix, ev.waiting, ev.sole)


def _suspect_seqs(spans: dict[int, tuple[int, list[int]]], per_rank: dict[int, dict[int, int]]) -> set[int]:
    """Sequence numbers where ranks may disagree; the common contiguous range is checked wholesale."""
    suspects: set[int] = set()
    for ids in per_rank.values():
        suspects.update(ids)
    if not spans:
        return suspects
    lo = max(first for first, _ in spans.values())
    hi = min(first + len(ids) - 1 for first, ids in spans.values())
    for first, ids in spans.values():
        # Outside the range every rank holds, compare seq by seq (few: ring starts and tails).
        suspects.update(s for s in range(first, first + len(ids)) if s < lo or s > hi)
    if lo <= hi:
        classes: dict[tuple[int, ...], int] = {}
        for first, ids in spans.values():
            classes.setdefault(tuple(ids[lo - first : hi - first + 1]), first)
        if len(classes) > 1:
            variants = list(classes)
            base = variants[0]
            for other in variants[1:]:
                suspects.update(lo + i for i, (a, b) in enumerate(zip(base, other)) if a != b)
    return suspects


def _blame_mismatch(pg: ProcessGroup, seq: int, at: dict[int, int], lookup: dict[int, Any]) -> list[tuple[int, Evidence]]:
    counts = Counter(at.values())
    ranked = counts.most_common()
    top, top_n = ranked[0]
    tie = len(ranked) > 1 and ranked[1][1] == top_n
    out = []
    majority_ranks = sorted(r for r, f in at.items() if f == top)
    for fid, _ in ranked if tie else ranked[1:]:
        ranks = sorted(r for r, f in at.items() if f == fid)
        others = sorted(r for r, f in at.items() if f != fid)
        other_fp = top if fid != top else ranked[1][0]
        text = (
            f"at #{seq} on {pg.label}, rank(s) {compress_ranks(ranks)} called {_describe(lookup[fid])} "
            f"where rank(s) {compress_ranks(others if tie else majority_ranks)} called {_describe(lookup[other_fp])}"
        )
        if tie:
            text += " (a tie: the dumps cannot tell which side diverged)"
        for r in ranks:
            out.append((r, Evidence("mismatch", pg.name, seq, text, tuple(others), not tie)))
    return out


# ---------------------------------------------------------------------------
# Stragglers


def _stragglers(job: Job, options: AnalysisOptions) -> list[tuple[int, Evidence]]:
    lateness: dict[int, list[float]] = {}
    last_count: Counter[int] = Counter()
    samples_in: dict[int, Counter[str]] = {}
    for pg in _ordered_groups(job):
        if len(pg.ranks) < 2 or any(r not in job.dumps for r in pg.ranks):
            continue
        times: dict[int, dict[int, int]] = {}
        for r in pg.ranks:
            bucket = [e for e in job.group_entries(r, pg.name)[-options.straggler_window * 2 :] if not e.is_p2p]
            times[r] = {e.collective_seq_id: e.time_created_ns for e in bucket}
        common = set.intersection(*(set(t) for t in times.values())) if times else set()
        for seq in sorted(common)[-options.straggler_window :]:
            stamps = {r: times[r][seq] for r in pg.ranks}
            med = statistics.median(stamps.values())
            for r, t in stamps.items():
                lateness.setdefault(r, []).append((t - med) / 1e9)
            latest_rank = max(stamps, key=stamps.__getitem__)
            last_count[latest_rank] += 1
            samples_in.setdefault(latest_rank, Counter())[pg.name] += 1
    out = []
    for rank, values in sorted(lateness.items()):
        n = len(values)
        if n < options.straggler_min_collectives:
            continue
        median_late = statistics.median(values)
        share_last = last_count[rank] / n
        if median_late >= options.straggler_threshold_s and share_last >= 0.5:
            group = samples_in[rank].most_common(1)[0][0]
            pg = job.groups[group]
            p90 = sorted(values)[int(0.9 * (n - 1))]
            text = (
                f"rank {rank} enqueued {last_count[rank]} of {n} recent collectives last, a median "
                f"{median_late * 1e3:.0f} ms after its peers (p90 {p90 * 1e3:.0f} ms), mostly on {pg.label}; "
                "no collective is stuck (a constant offset could also be clock skew between hosts)"
            )
            out.append((rank, Evidence("straggler", group, None, text)))
    return out


# ---------------------------------------------------------------------------
# Culprit records


def _culprit(job: Job, rank: int, evidence: list[Evidence]) -> Culprit:
    ordered = sorted(
        evidence,
        key=lambda e: (KIND_ORDER.index(e.kind), not e.direct, not e.sole, -len(e.waiting), e.seq or 0),
    )
    primary = ordered[0]
    pg = job.groups.get(primary.group)
    op = None
    if primary.seq is not None:
        for r in (rank, *primary.waiting):
            found = _entries_at(job, r, primary.group, primary.seq)
            if found:
                op = found[0].profiling_name
                break
    return Culprit(
        rank=rank,
        kind=primary.kind,
        group_name=primary.group,
        group_desc=pg.desc if pg else "",
        collective_seq_id=primary.seq,
        evidence=primary.text,
        op=op,
        waiting_ranks=primary.waiting,
        last_frame=_last_user_frame(job, rank),
        related=tuple(_dedupe_evidence(ordered[1:])),
    )


def _dedupe_evidence(items: list[Evidence]) -> list[Evidence]:
    seen = set()
    out = []
    for e in items:
        key = (e.kind, e.group, e.seq)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _last_user_frame(job: Job, rank: int) -> Frame | None:
    """The innermost frame outside torch of the rank's newest entry: where the user's code was."""
    dump = job.dumps.get(rank)
    if dump is None or not dump.has_frames:
        return None
    for e in reversed(dump.entries):
        if e.frames:
            for f in e.frames:
                if "/torch/" not in f.filename and "\\torch\\" not in f.filename:
                    return f
            return e.frames[0]
    return None
