"""Mismatches: ranks that entered the same sequence number with a different call.

Per group, each rank's collectives become interned fingerprints (op, sizes,
dtypes, with per-op exceptions for legitimately uneven ops). The range every
rank holds is compared wholesale (tuple equality, C speed); only sequence
numbers that differ, or that some ranks hold and others do not, are examined one
by one. The minority is the culprit; a tie says so.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import replace
from typing import Any, TypeAlias

from ..common.ranks import compress_ranks
from ..read.dump import GroupHistory
from ..read.validate import is_unknown_call
from .job import Job, ProcessGroup
from .kinds import CulpritKind
from .verdict import Evidence

__all__ = ["describe_call", "find_mismatches"]


def _coalesced(fp: Any) -> bool:
    return bool(fp) and isinstance(fp[0], tuple)


def _describe_pair(mine: Any, theirs: Any) -> tuple[str, str]:
    """Both sides' calls; in a coalesced group, the first op that differs (not the group's first op)."""
    if _coalesced(mine) or _coalesced(theirs):
        a = mine if _coalesced(mine) else (mine,)
        b = theirs if _coalesced(theirs) else (theirs,)
        for i in range(max(len(a), len(b))):
            x = a[i] if i < len(a) else None
            y = b[i] if i < len(b) else None
            if x != y:
                where = f" (op {i + 1} of a coalesced group)"
                return ((describe_call(x) if x else "nothing") + where, (describe_call(y) if y else "nothing") + where)
    return describe_call(mine), describe_call(theirs)


def describe_call(fp: Any) -> str:
    """``all_reduce [4,4] Float`` for a comparable fingerprint (or the first of a coalesced group)."""
    if _coalesced(fp):
        fp = fp[0]
    op, in_sizes, in_dtypes, out_sizes, out_dtypes = fp
    sizes = in_sizes or out_sizes
    dtypes = in_dtypes or out_dtypes
    size_text = ",".join("[" + ",".join(map(str, s)) + "]" for s in sizes) or "[]"
    return f"{op} {size_text} {'/'.join(dtypes)}".strip()


_Span: TypeAlias = "tuple[int, array[int]]"  # first seq, fingerprint ids of seq first, first+1, ...


def _rank_fingerprints(h: GroupHistory | None, lookup: dict[int, Any]) -> _Span | dict[int, int] | None:
    """One fingerprint id per seq: contiguous -> (first seq, ids) for wholesale comparison,
    else (gaps, or coalesced ops sharing a seq) a dict seq -> id (a coalesced id joins ``lookup``)."""
    if h is None or not h.seq:
        return None
    seqs, ids = h.seq, h.fingerprint
    if h.contiguous:
        return seqs[0], ids
    by_seq: dict[int, Any] = {}
    for seq, fid in zip(seqs, ids):
        prev = by_seq.get(seq)
        by_seq[seq] = fid if prev is None else (prev if isinstance(prev, tuple) else (prev,)) + (fid,)
    out: dict[int, int] = {}
    for seq, value in by_seq.items():
        if isinstance(value, tuple):  # coalesced: several ops under one seq
            combined = hash(value)
            lookup.setdefault(combined, tuple(lookup.get(v) for v in value))
            value = combined
        out[seq] = value
    return out


def find_mismatches(job: Job) -> list[tuple[int, Evidence]]:
    """The first sequence number per group where ranks disagree, blaming the minority."""
    found: list[tuple[int, Evidence]] = []
    # fingerprint id -> call, from each dump's own table once (a handful of distinct calls per
    # dump; a set of every group's ids per rank cost ~30 us per rank and group, 17 ms at 256 ranks).
    # Ranks decoded from one node summary share one table: each table is read once.
    lookup: dict[int, Any] = {}
    tables = {id(each.fingerprints): each.fingerprints for each in job.dumps.values()}
    for table in tables.values():
        for fid, call in table.items():
            lookup.setdefault(fid, call)
    for pg in job.ordered_groups():
        if len(pg.ranks) < 2:
            continue
        per_rank: dict[int, dict[int, int]] = {}
        spans: dict[int, _Span] = {}
        for r in pg.ranks:
            dump = job.dumps.get(r)
            if dump is None:
                continue
            fps = _rank_fingerprints(dump.histories.get(pg.name), lookup)
            if isinstance(fps, tuple):
                spans[r] = fps
            elif fps:
                per_rank[r] = fps
        suspect_seqs = _suspect_seqs(spans, per_rank)
        if not suspect_seqs:
            continue
        # A wrapped ring may begin inside a coalesced group: its oldest seq can lack its first ops.
        oldest = {r: (spans[r][0] if r in spans else min(per_rank[r])) for r in (*spans, *per_rank)
                  if not job.dumps[r].from_start}
        first_bad: int | None = None
        bad_count = 0
        group_found: list[tuple[int, Evidence]] = []
        for seq in sorted(suspect_seqs):
            at = {}
            for r, (first, ids) in spans.items():
                if first <= seq < first + len(ids):
                    at[r] = ids[seq - first]
            for r, ids_by_seq in per_rank.items():
                if seq in ids_by_seq:
                    at[r] = ids_by_seq[seq]
            # A call whose fields were unreadable (repaired by the reader) proves nothing either way.
            at = {r: fid for r, fid in at.items() if not is_unknown_call(lookup.get(fid))}
            at = _without_cut_groups(at, seq, oldest, lookup)
            if len(set(at.values())) < 2:
                continue
            bad_count += 1
            if first_bad is None:
                first_bad = seq
                group_found = _blame_mismatch(pg, seq, at, lookup)
        if bad_count > 1:
            group_found = [(r, _with_suffix(ev, f" ({bad_count} sequence numbers differ in all)")) for r, ev in group_found]
        found.extend(group_found)
    return found


def _without_cut_groups(at: dict[int, int], seq: int, oldest: dict[int, int], lookup: dict[int, Any]) -> dict[int, int]:
    """Leave out a rank whose ring starts at ``seq`` holding only the last ops of a coalesced group
    that others hold whole (the ring overwrote the first ones): a cut, not a different call."""
    cut = [r for r, fid in at.items() if oldest.get(r) == seq and _is_cut(lookup.get(fid), at.values(), lookup)]
    return {r: fid for r, fid in at.items() if r not in cut} if cut else at


def _is_cut(mine: Any, others: Any, lookup: dict[int, Any]) -> bool:
    ops = _ops(mine)
    return any(len(theirs) > len(ops) and theirs[-len(ops):] == ops
               for theirs in (_ops(lookup.get(fid)) for fid in set(others)))


def _ops(fp: Any) -> tuple[Any, ...]:
    return tuple(fp) if _coalesced(fp) else (fp,)


def _with_suffix(ev: Evidence, suffix: str) -> Evidence:
    return replace(ev, text=ev.text + suffix)


def _suspect_seqs(spans: dict[int, _Span], per_rank: dict[int, dict[int, int]]) -> set[int]:
    """Sequence numbers where ranks may disagree; the common contiguous range is checked wholesale."""
    suspects: set[int] = set()
    for rank_ids in per_rank.values():
        suspects.update(rank_ids)
    if not spans:
        return suspects
    # Ranks that made the same calls usually hold one shared column (a node summary's, or the reader's):
    # each distinct (first seq, column) is compared once, not once per rank.
    distinct = list({(first, id(ids)): (first, ids) for first, ids in spans.values()}.values())
    lo = max(first for first, _ in distinct)
    hi = min(first + len(ids) - 1 for first, ids in distinct)
    for first, ids in distinct:
        # Outside the range every rank holds, compare seq by seq (few: ring starts and tails).
        end = first + len(ids)
        suspects.update(range(first, min(lo, end)))
        suspects.update(range(max(hi + 1, first), end))
    if lo <= hi:
        classes: dict[bytes, array[int]] = {}
        for first, ids in distinct:
            window = ids[lo - first : hi - first + 1]
            classes.setdefault(window.tobytes(), window)  # bytes: hashed and compared in C
        if len(classes) > 1:
            variants = list(classes.values())
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
        mine, theirs = _describe_pair(lookup.get(fid), lookup.get(other_fp))
        text = (
            f"at #{seq} on {pg.label}, rank(s) {compress_ranks(ranks)} called {mine} "
            f"where rank(s) {compress_ranks(others if tie else majority_ranks)} called {theirs}"
        )
        if tie:
            text += " (a tie: the dumps cannot tell which side diverged)"
        for r in ranks:
            out.append((r, Evidence(CulpritKind.MISMATCH, pg.name, seq, text, tuple(others), not tie)))
    return out
