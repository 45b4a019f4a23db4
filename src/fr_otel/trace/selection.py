"""Which recorder entries become spans: the incident's focus, recent history, and a span budget.

A focused trace keeps, per rank and group, the last ``last_n`` entries plus everything in
flight (:func:`fr_otel.read.recent.recent_and_in_flight`) and the collectives the verdict
points at, however old. When that exceeds ``max_spans`` the history is halved until it
fits; culprit ranks always keep the full ``last_n``. ``full`` keeps every entry.

A job too large for a span per rank (a rank span and its focus entries each: past
``max_spans / 2`` ranks) gets a trace a person can open: every culprit, and the peers each is
compared with (ranks waiting on it, whole dumps first: :func:`detailed_ranks`), in full; every
other rank only in one span per group kind and state (:mod:`.aggregate_spans`). The whole trace
stays under :data:`MAX_TRACE_SPANS` whatever the job's size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

from ..diagnosis.focus import incident_focus
from ..diagnosis.job import Job
from ..diagnosis.verdict import Verdict
from ..read.columns import TAIL_PER_GROUP
from ..read.dump import Entry
from ..read.recent import recent_and_in_flight
from .options import TraceOptions

__all__ = ["MAX_DETAILED_CULPRITS", "MAX_TRACE_SPANS", "PEERS_PER_CULPRIT", "Selection", "detailed_ranks",
           "select_entries"]


#: A hard bound on one incident's spans, whatever the job (Jaeger and Tempo open a trace this size).
MAX_TRACE_SPANS = 20_000
#: A large job's trace shows at most this many culprits in full (the root lists them all).
MAX_DETAILED_CULPRITS = 512
#: And, for each of its first culprits, this many of the ranks that wait on it.
PEERS_PER_CULPRIT = 4
_CULPRITS_WITH_PEERS = 64
#: Room kept for the aggregate spans of a large job's trace.
AGGREGATE_BUDGET = 2_000


@dataclass(slots=True)
class Selection:
    """The entries chosen per rank and how the choice was bounded."""

    entries: dict[int, list[Entry]]
    entries_total: int  # entries in the dumps
    last_n: int  # recent entries kept per group per rank (-1: every entry)
    notes: list[str] = field(default_factory=list)
    detailed: set[int] | None = None  # the ranks shown in full; None: every rank


def select_entries(job: Job, verdict: Verdict, options: TraceOptions) -> Selection:
    """Per rank, the entries that become spans (record order)."""
    entries_total = sum(d.entry_count for d in job.dumps.values())
    if options.full:
        return Selection({r: list(d.entries) for r, d in job.dumps.items()}, entries_total, -1)
    focus = _focus_seqs(verdict)
    culprits = {c.rank for c in verdict.culprits}
    detailed = detailed_ranks(job, verdict, options)
    ranks = sorted(job.dumps) if detailed is None else sorted(detailed)
    if detailed is None:
        budget = max(options.max_spans - 2 * len(job.dumps) - 1, 0)
    else:
        budget = max(MAX_TRACE_SPANS - AGGREGATE_BUDGET - 2 * len(ranks) - 1, 0)
    last_n = culprit_n = options.last_n
    while True:
        chosen = {r: _select_rank(job, r, focus, culprit_n if r in culprits else last_n) for r in ranks}
        count = sum(map(len, chosen.values()))
        if count <= budget:
            break
        if last_n > 0:
            last_n //= 2
        elif detailed is not None and culprit_n > 0:  # the hard bound holds whatever the culprits hold
            culprit_n //= 2
        else:
            break
    notes = []
    if last_n < options.last_n:
        cap = options.max_spans if detailed is None else MAX_TRACE_SPANS
        notes.append(
            f"kept the last {last_n} collective(s) per group per rank (not {options.last_n}) to stay "
            f"under {cap} spans; culprits keep {culprit_n}"
        )
    if detailed is not None:
        notes.append(f"{len(detailed)} of {len(job.dumps)} ranks in full (culprits and the peers they are compared "
                     "with); the others in one span per group kind and state")
    return Selection(chosen, entries_total, last_n, notes, detailed)


def detailed_ranks(job: Job, verdict: Verdict, options: TraceOptions) -> set[int] | None:
    """The ranks a large job's trace shows in full: its culprits (up to :data:`MAX_DETAILED_CULPRITS`)
    and, for each of the first ones, up to :data:`PEERS_PER_CULPRIT` ranks that wait on it (whole
    dumps before compact ones, then the nearest ranks); None when every rank fits (``max_spans``)."""
    if options.full or 2 * len(job.dumps) + 1 <= options.max_spans:
        return None
    chosen = {c.rank for c in verdict.culprits[:MAX_DETAILED_CULPRITS] if c.rank in job.dumps}
    for c in verdict.culprits[:_CULPRITS_WITH_PEERS]:
        waiting = [r for r in c.waiting_ranks if r in job.dumps and r not in chosen]
        waiting.sort(key=lambda r: (job.dumps[r].compact, abs(r - c.rank), r))
        chosen.update(waiting[:PEERS_PER_CULPRIT])
    if not chosen and job.dumps:
        chosen.add(min(job.dumps))  # no culprit: one rank in full shows what a rank was doing
    return chosen


def _focus_seqs(verdict: Verdict) -> dict[str, set[int]]:
    """Per group, the collectives the incident is about (:func:`incident_focus`), each culprit's
    related ones, and the one before each culprit's: the context a reader compares with."""
    focus: dict[str, set[int]] = {}
    for group, seq in incident_focus(verdict).all:
        focus.setdefault(group, set()).add(seq)
    for c in verdict.culprits:
        for group, related in [(c.group_name, c.collective_seq_id), *((e.group, e.seq) for e in c.related)]:
            if related is not None:
                focus.setdefault(group, set()).update((related - 1, related))
    return focus


def _select_rank(job: Job, rank: int, focus: dict[str, set[int]], keep_n: int) -> list[Entry]:
    dump = job.dumps[rank]
    # The tail (newest entries per group + everything in flight) usually covers the
    # focus; only older focus seqs (a mismatch deep in history) need the full dump.
    entries = dump.tail if keep_n <= TAIL_PER_GROUP else dump.entries
    chosen = recent_and_in_flight(
        entries, keep_n, attrgetter("pg_name"), attrgetter("completed"),
        also=lambda e: e.collective_seq_id in focus.get(e.pg_name, ()),
    )
    if entries is dump.tail:
        have = {(e.pg_name, e.collective_seq_id) for e in chosen if not e.is_p2p}
        older = [
            e
            for group, seqs in focus.items()
            for seq in sorted(seqs)
            if (group, seq) not in have
            for e in job.entries_at(rank, group, seq)
        ]
        if older:
            chosen = sorted(chosen + older, key=lambda e: e.record_id)
    return chosen
