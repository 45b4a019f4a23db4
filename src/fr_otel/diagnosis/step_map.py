"""Which training step each collective belongs to, from the ranks' step logs.

Each rank reads its own clock against its own ring of step starts (:class:`~fr_otel.read.steps.StepLog`),
so no clock is compared across ranks here. Also builds the step map written beside the dumps
(``steps.json``: per rank its step, step starts and, per group, the first sequence number of each step).
"""

from __future__ import annotations

from typing import Any

from .job import Job

__all__ = ["first_seqs", "step_of_collective", "steps_file_json"]


def first_seqs(job: Job, rank: int) -> dict[str, list[tuple[int, int]]]:
    """Per group, ``(step, first collective seq)`` of each step the rank's entries show."""
    dump = job.dumps.get(rank)
    log = dump.steps if dump is not None else None
    out: dict[str, list[tuple[int, int]]] = {}
    if dump is None or log is None:
        return out
    for name, h in dump.histories.items():
        pairs: list[tuple[int, int]] = []
        for seq, created in zip(h.seq, h.created_ns):
            s = log.step_at(created)
            if s is not None and (not pairs or s != pairs[-1][0]):
                pairs.append((s, seq))
        if pairs:
            out[name] = pairs
    return out


def step_of_collective(job: Job, group: str, seq: int) -> int | None:
    """The step collective ``seq`` of ``group`` belongs to, from any rank that enqueued it and
    counted steps (each rank reads its own clock against its own ring)."""
    for rank in sorted(job.dumps):
        dump = job.dumps[rank]
        if dump.steps is None:
            continue
        h = dump.histories.get(group)
        if h is None:
            continue
        i = h.position(seq)
        if i is None:
            continue
        found = dump.steps.step_at(h.created_ns[i])
        if found is not None:
            return found
    return None


def steps_file_json(job: Job) -> dict[str, Any]:
    """The step map written beside the dumps: per rank its step, step starts and, per group,
    the first sequence number of each recent step. A compact rank (a node summary's, in a job of
    thousands of nodes) says only its step: its starts and entries stayed on its node, and 100k
    ranks' worth of them would be 100 MB of JSON."""
    ranks: dict[str, Any] = {}
    for rank, dump in sorted(job.dumps.items()):
        if dump.steps is not None and dump.compact:
            ranks[str(rank)] = {"step": dump.steps.step, "source": dump.steps.source, "starts": []}
        elif dump.steps is not None:
            ranks[str(rank)] = {**dump.steps.as_json(),
                                "first_seq": {g: [list(p) for p in pairs] for g, pairs in first_seqs(job, rank).items()}}
    return {"version": 1, "ranks": ranks}
