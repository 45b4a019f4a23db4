"""The ranks a large job's trace does not show in full, as one span per group kind and state.

At 100k ranks a span per rank is a trace nobody can open. The ranks that are not culprits nor
their peers (:func:`fr_otel.trace.selection.detailed_ranks`) are still all there, folded by what
they were doing in each group: waiting in its collective in flight, never enqueued it, no dump,
or idle (nothing in flight). Groups of one kind (``desc``) in the same state at the same
collective fold into one span: "99,992 ranks waiting in all_reduce #10000 on default_pg, ranks
0-33332,33334-99999", with the ranks as runs, the groups and the counts as attributes, linked
to the collective's span when the trace has one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from ..common.ranks import compress_ranks
from ..common.text import MAX_ATTRIBUTE_CHARS, clip
from ..diagnosis.verdict import GroupState
from . import attributes as A
from .collective_spans import EntriesByCollective, collective_span_id
from .frame import SCOPE, TraceFrame

__all__ = ["MAX_AGGREGATE_SPANS", "aggregate_spans"]

#: At most this many aggregate spans: past it, states at different collectives fold together.
MAX_AGGREGATE_SPANS = 1_000
_RUNS_SHOWN = 400  # runs of ranks written out in the attribute (clipped to its 2000 characters)
_LINKS = 8

_WORDS = {"waiting": "waiting in", "not_entered": "that never enqueued", "no_dump": "with no dump, members of",
          "idle": "idle after"}


@dataclass(slots=True)
class _Fold:
    """Ranks of one group kind in one state at one collective."""

    ranks: set[int] = field(default_factory=set)
    groups: list[str] = field(default_factory=list)
    op: str | None = None
    first_ns: int | None = None


def aggregate_spans(frame: TraceFrame, detailed: set[int], collectives: EntriesByCollective) -> list[ReadableSpan]:
    """One span per (group kind, state, collective) for the ranks not in ``detailed``."""
    folds: dict[tuple[str, str, int | None], _Fold] = {}
    for state in frame.verdict.groups:
        for (kind, seq, op), ranks in _states(state):
            shown = [r for r in ranks if r not in detailed]
            if not shown:
                continue
            fold = folds.setdefault((state.group.desc, kind, seq), _Fold(op=op))
            fold.ranks.update(shown)
            fold.groups.append(state.group.name)
            first = frame.job.first_enqueue(state.group.name, seq) if seq is not None else None
            if first and (fold.first_ns is None or first < fold.first_ns):
                fold.first_ns = first
    if len(folds) > MAX_AGGREGATE_SPANS:
        folds = _fold_further(folds)
    return [_span(frame, key, fold, collectives) for key, fold in sorted(folds.items(), key=_order)]


def _states(state: GroupState) -> Iterable[tuple[tuple[str, int | None, str | None], tuple[int, ...]]]:
    """The group's members by what they were doing there."""
    f = state.in_flight
    if f is not None:
        yield ("waiting", f.seq, f.op), f.entered
        yield ("not_entered", f.seq, f.op), f.not_entered
        yield ("no_dump", f.seq, f.op), f.unknown
        return
    known = {r: p for r, p in state.progress.items() if p is not None}
    if known:
        yield ("idle", max(p.completed for p in known.values()), None), tuple(known)
    unknown = tuple(r for r, p in state.progress.items() if p is None)
    if unknown:
        yield ("no_dump", None, None), unknown


def _fold_further(folds: dict[tuple[str, str, int | None], _Fold]) -> dict[tuple[str, str, int | None], _Fold]:
    """Too many distinct collectives: one span per group kind and state, whatever the collective."""
    out: dict[tuple[str, str, int | None], _Fold] = {}
    for (desc, kind, _), fold in folds.items():
        merged = out.setdefault((desc, kind, None), _Fold(op=fold.op))
        merged.ranks |= fold.ranks
        merged.groups.extend(fold.groups)
        if fold.op != merged.op:
            merged.op = None
        if fold.first_ns and (merged.first_ns is None or fold.first_ns < merged.first_ns):
            merged.first_ns = fold.first_ns
    return out


def _order(item: tuple[tuple[str, str, int | None], _Fold]) -> tuple[int, str, str, int]:
    (desc, kind, seq), _ = item
    return (list(_WORDS).index(kind), desc, kind, seq if seq is not None else -1)


def _sentence(count: int, kind: str, op: str | None, seq: int | None, desc: str, groups: int, runs: str) -> str:
    what = " ".join(p for p in (op or ("collective" if seq is not None else ""), f"#{seq}" if seq is not None else "")
                    if p)
    where = f"{desc or 'group'}" + (f" ({groups:,} groups)" if groups > 1 else "")
    at = f" {what} on" if what else ""
    return f"{count:,} rank{'s' if count != 1 else ''} {_WORDS[kind]}{at} {where}, ranks {runs}"


def _span(frame: TraceFrame, key: tuple[str, str, int | None], fold: _Fold,
          collectives: EntriesByCollective) -> ReadableSpan:
    desc, kind, seq = key
    runs = compress_ranks(fold.ranks, limit=_RUNS_SHOWN)
    attrs: dict[str, Any] = {
        A.SPAN_ROLE: "ranks",
        A.RANKS_STATE: kind,
        A.RANKS: clip(runs, MAX_ATTRIBUTE_CHARS),
        A.RANKS_COUNT: len(fold.ranks),
        A.PG_DESC: desc,
        A.GROUPS: clip(",".join(fold.groups), MAX_ATTRIBUTE_CHARS),
        A.GROUPS_COUNT: len(fold.groups),
        A.SUMMARY: clip(_sentence(len(fold.ranks), kind, fold.op, seq, desc, len(fold.groups), runs),
                        MAX_ATTRIBUTE_CHARS),
    }
    if len(fold.groups) == 1:
        attrs[A.PG_NAME] = fold.groups[0]
    if seq is not None:
        attrs[A.SEQ_ID] = seq
    if fold.op:
        attrs[A.OP] = fold.op
    links: list[Link] = []
    if seq is not None:
        for group in fold.groups:
            seen = collectives.get((group, seq))
            if seen and len(links) < _LINKS:
                links.append(Link(frame.context(collective_span_id(frame, group, seq)),
                                  {"fr_otel.link": "collective"}))
    status = Status(StatusCode.UNSET)
    verdict = frame.verdict
    if kind in ("waiting", "not_entered", "no_dump") and seq is not None and verdict.verdict.stuck:
        blamed = compress_ranks(c.rank for c in verdict.blamed)
        status = Status(StatusCode.ERROR, f"{verdict.verdict}" + (f", waiting for rank(s) {blamed}" if blamed else ""))
    start = min(fold.first_ns or frame.now, frame.now)
    verb = {"waiting": "waiting", "not_entered": "not entered", "no_dump": "no dump", "idle": "idle"}[kind]
    return ReadableSpan(
        name=f"ranks {verb}" + (f": {fold.op}" if fold.op else ""),
        context=frame.context(frame.span_id("ranks", desc, kind, seq if seq is not None else -1)),
        parent=frame.context(frame.root_id),
        resource=frame.job_resource,
        attributes=A.bounded(attrs),
        links=links,
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=start,
        end_time=frame.now,
        instrumentation_scope=SCOPE,
    )
