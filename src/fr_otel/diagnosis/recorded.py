"""A node's folder alone: the verdict the live incident wrote, not a re-analysis of part of its dumps.

Each node of a job keeps its own ranks' dumps, with a copy of the coordinator's ``incident.json``.
Read alone, that folder lacks the other nodes' dumps, which the live verdict had (through their
node summaries): re-analysed, the ranks that are merely elsewhere would look lost, and the verdict
could blame the very node the folder was found on. So when the live incident had dumps of ranks
this folder lacks, the verdict is the one it recorded (its word, culprits and hosts), and a note says
which ranks the folder holds and on which hosts the others' dumps are; every node's folder read
together is analysed again, in full.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..common.ranks import compress_ranks
from .cause_kinds import cause_from_json
from .culprit_record import culprit_record
from .hosts import HostFinding
from .job import Job
from .kinds import KIND_ORDER, CulpritKind, VerdictWord
from .verdict import Culprit, Evidence, Verdict

__all__ = ["Partial", "adopt_recorded", "partial_folder", "recorded_collective_steps"]

_MAX_ITEMS = 4096  # culprits and hosts read back from an untrusted summary


@dataclass(frozen=True, slots=True)
class Partial:
    """This folder holds part of a live incident's ranks: which, of how many, and where the others' dumps are."""

    here: tuple[int, ...]
    world_size: int
    elsewhere: dict[str, tuple[int, ...]]  # host (or "" when unknown) -> ranks whose dumps the live incident had
    source: str  # the incident.json whose verdict is shown

    def sentence(self) -> str:
        """``this folder holds ranks 0-1 of 6; the live verdict had the dumps of node2 (ranks 4-5) too: ...``."""
        where = ", ".join(f"{h or 'an unknown host'} (rank{'s' if len(r) > 1 else ''} {compress_ranks(r)})"
                          for h, r in sorted(self.elsewhere.items()))
        return (f"this folder holds rank(s) {compress_ranks(self.here)} of {self.world_size}; the live incident also "
                f"had the dumps of {where}: the verdict shown is the one it wrote ({self.source}); to analyse again, "
                "pass every node's folder of the incident (or one folder with a subfolder per node)")


def _ints(raw: Any) -> list[int]:
    return [r for r in raw[:_MAX_ITEMS] if type(r) is int and r >= 0] if isinstance(raw, list) else []


def _docs(summary: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    raw = summary.get(key)
    return [d for d in raw[:_MAX_ITEMS] if isinstance(d, dict)] if isinstance(raw, list) else []


def partial_folder(job: Job) -> Partial | None:
    """What the live incident had that this folder lacks, or None (not a live incident's, or nothing lacking)."""
    summary = job.recorded
    if not summary or job.world_size is None or summary.get("verdict") not in set(VerdictWord):
        return None
    hosts = _docs(summary, "hosts")
    if hosts:
        live_missing = {r for h in hosts for r in _ints(h.get("missing"))}
    else:
        live_missing = {r for d in _docs(summary, "culprits") if d.get("kind") == CulpritKind.MISSING_DUMP
                        for r in _ints([d.get("rank")])}
    lacking = [r for r in range(job.world_size) if r not in job.dumps and r not in live_missing]
    if not lacking:
        return None
    elsewhere: dict[str, list[int]] = {}
    for rank in lacking:
        elsewhere.setdefault(job.hosts.get(rank, ""), []).append(rank)
    return Partial(tuple(sorted(job.dumps)), job.world_size, {h: tuple(r) for h, r in elsewhere.items()},
                   job.recorded_from)


def adopt_recorded(job: Job, verdict: Verdict) -> Verdict:
    """``verdict``, or (for a folder holding part of a live incident) the verdict that incident recorded."""
    partial = partial_folder(job)
    if partial is None:
        return verdict
    summary = job.recorded
    ours = {c.rank: c for c in verdict.culprits}
    stuck = next((g for g in verdict.groups if g.in_flight is not None), None)
    group = stuck.group.name if stuck else ""
    seq = stuck.in_flight.seq if stuck and stuck.in_flight else None
    culprits: list[Culprit] = []
    for doc in _docs(summary, "culprits"):
        rank, kind = doc.get("rank"), doc.get("kind")
        if type(rank) is not int or rank < 0 or kind not in set(CulpritKind):
            continue
        kind = CulpritKind(kind)
        step, collective_step = doc.get("step"), doc.get("collective_step")
        mine = ours.get(rank)
        if mine is None or mine.kind != kind:
            text = _text(doc.get("evidence")) or f"rank {rank}: {kind} (the live verdict)"
            mine = replace(culprit_record(job, rank, [Evidence(kind, group, seq, text)]), evidence=text)
        # What the live verdict knew (every node's steps, through their summaries) wins over this part's.
        culprits.append(replace(mine, host=mine.host or job.hosts.get(rank) or _text(doc.get("host")),
                                cause=cause_from_json(doc.get("cause")) or mine.cause,
                                step=step if type(step) is int else mine.step,
                                collective_step=collective_step if type(collective_step) is int else mine.collective_step))
    culprits.sort(key=lambda c: (KIND_ORDER.index(c.kind), c.rank))
    by_host: dict[str, list[int]] = {}
    for c in culprits:
        if c.blamed and (c.node or c.host):
            by_host.setdefault(c.node or c.host or "", []).append(c.rank)
    return replace(
        verdict, verdict=VerdictWord(summary["verdict"]), culprits=culprits, stop_order=None, waiting=[],
        incomplete=None, hosts=[f for f in map(_finding, _docs(summary, "hosts")) if f is not None],
        nodes=[(h, tuple(sorted(r))) for h, r in sorted(by_host.items()) if len(r) > 1],
        notes=[partial.sentence(), *verdict.notes])


def recorded_collective_steps(job: Job) -> dict[int, int]:
    """Per culprit rank, the step the live incident placed its collective in. The live coordinator read it from
    node summaries, whose step maps stay on their nodes: every node's folder read together may hold no step
    map that places the collective a frozen host's peers wait in."""
    return {doc["rank"]: doc["collective_step"] for doc in _docs(job.recorded or {}, "culprits")
            if type(doc.get("rank")) is int and type(doc.get("collective_step")) is int}


def _text(raw: Any) -> str | None:
    return raw if isinstance(raw, str) and raw else None


def _finding(doc: dict[str, Any]) -> HostFinding | None:
    """One host of the recorded verdict (``summary.hosts``), or None when ill-typed."""
    host, state = _text(doc.get("host")), doc.get("state")
    if host is None or not isinstance(state, str):
        return None
    heard, step, before, answered, group_step = (doc.get(k) for k in (
        "last_heard_ns", "last_step", "silent_before_stall_s", "answered", "group_step"))
    return HostFinding(host, tuple(_ints(doc.get("ranks"))), tuple(_ints(doc.get("missing"))),
                       tuple(_ints(doc.get("blamed"))), state, heard if type(heard) is int else None,
                       float(before) if isinstance(before, (int, float)) and type(before) is not bool else None,
                       answered if type(answered) is bool else None, doc.get("store") is True,
                       step if type(step) is int else None, group_step if type(group_step) is int else None,
                       _text(doc.get("probed")))
