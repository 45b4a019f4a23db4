"""Mismatches: ranks that entered the same sequence number with a different call.

Per group, each rank's collectives become interned fingerprints (op, sizes,
dtypes, with per-op exceptions for legitimately uneven ops). The range every
rank holds is compared wholesale (tuple equality, C speed); only sequence
numbers that differ, or that some ranks hold and others do not, are examined one
by one. The minority is the culprit; a tie says so.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .dump import Entry
from .job import Job, ProcessGroup
from .ranks import compress_ranks
from .verdict import Evidence

__all__ = ["find_mismatches"]


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


def find_mismatches(job: Job) -> list[tuple[int, Evidence]]:
    found: list[tuple[int, Evidence]] = []
    intern: dict[Any, int] = {}
    for pg in job.ordered_groups():
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
