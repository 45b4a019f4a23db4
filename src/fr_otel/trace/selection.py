"""Which recorder entries become spans: the incident's focus, recent history, and a span budget.

A focused trace keeps, per rank and group, the last ``last_n`` entries plus everything in
flight (:func:`fr_otel.read.recent.recent_and_in_flight`) and the collectives the verdict
points at, however old. When that exceeds ``max_spans`` the history is halved until it
fits; culprit ranks always keep the full ``last_n``. ``full`` keeps every entry.
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

__all__ = ["Selection", "select_entries"]


@dataclass(slots=True)
class Selection:
    """The entries chosen per rank and how the choice was bounded."""

    entries: dict[int, list[Entry]]
    entries_total: int  # entries in the dumps
    last_n: int  # recent entries kept per group per rank (-1: every entry)
    notes: list[str] = field(default_factory=list)


def select_entries(job: Job, verdict: Verdict, options: TraceOptions) -> Selection:
    """Per rank, the entries that become spans (record order)."""
    entries_total = sum(d.entry_count for d in job.dumps.values())
    if options.full:
        return Selection({r: list(d.entries) for r, d in job.dumps.items()}, entries_total, -1)
    focus = _focus_seqs(verdict)
    culprits = {c.rank for c in verdict.culprits}
    budget = max(options.max_spans - 2 * len(job.dumps) - 1, 0)
    last_n = options.last_n
    while True:
        chosen = {r: _select_rank(job, r, focus, options.last_n if r in culprits else last_n) for r in job.dumps}
        count = sum(map(len, chosen.values()))
        if count <= budget or last_n == 0:
            break
        last_n //= 2
    notes = []
    if last_n < options.last_n:
        notes.append(
            f"kept the last {last_n} collective(s) per group per rank (not {options.last_n}) to stay "
            f"under {options.max_spans} spans; culprits keep {options.last_n}"
        )
    return Selection(chosen, entries_total, last_n, notes)


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
