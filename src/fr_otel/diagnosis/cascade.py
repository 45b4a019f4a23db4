"""Cascades: who waits only because of a culprit, and absent ranks whose silence is explained.

Once the culprits are known, every other rank that waits does so through them: its waits
lead, rank by rank and group by group, to a culprit. :func:`waiting_on` says which culprit(s)
each waiting rank ends at ("waits on rank 30"), so a rank stuck behind a hung collective is
reported as such, never as a culprit of its own.

A rank without a readable dump (absent, truncated) that others wait on is a candidate
``missing_dump``. It is only that when it is the best explanation. When it shares a group
with a proven culprit, and its peers' records show it kept pace until that culprit stopped
(they completed work with it that late), it was most likely stuck behind that culprit like its
peers: it is reported as ``unknown``, not blamed. Only-active dumps hold no completed work,
so they can never show that a rank kept pace: there it stays ``missing_dump``. Nor is a silence explained
when the rank's host saw a fault of its own (:func:`own_fault`: its process stopped, or gone without
saying why): a rank SIGSTOPped a second after another went astray is a culprit too, not a waiter.
"""

from __future__ import annotations

from ..read.entry_rules import p2p_name
from .job import Job
from .kinds import MembershipSource
from .verdict import Waiting
from .waits import WaitGraph

__all__ = ["explained_absences", "own_fault", "waiting_on"]


def own_fault(job: Job, rank: int) -> str:
    """What its host saw of ``rank``'s process that is a fault of its own, whoever else stopped first: stopped
    (``T``), or gone without an exit record or with its own exception; "" when none (a waiter torn down by
    SIGTERM or a collective's failure is no fault of its own)."""
    facts, leaving = job.host_facts.get(rank), job.exits.get(rank)
    if facts is not None and facts.state in ("T", "t"):
        return f"its host saw its process {facts.pid} stopped (state {facts.state})"
    if leaving is not None and leaving.how == "exception":
        return f"it raised {leaving.type or 'an exception'}"
    dump = job.dumps.get(rank)
    spoke = dump is not None and dump.now is not None  # its own agent sent its live stacks: it was alive then
    if facts is not None and facts.gone and leaving is None and not spoke:
        return f"its host saw its process {facts.pid} gone without an exit record"
    return ""

def waiting_on(graph: WaitGraph, culprits: set[int], listed: set[int]) -> list[Waiting]:
    """Every waiting rank not already ``listed``, grouped by the culprit(s) its waits lead to."""
    by_target: dict[tuple[int, ...], list[int]] = {}
    for rank, targets in graph.reaching(culprits).items():
        if rank not in listed:
            by_target.setdefault(tuple(sorted(targets)), []).append(rank)
    return [Waiting(tuple(sorted(ranks)), targets) for targets, ranks in sorted(by_target.items())]


def explained_absences(job: Job, absent: list[int], proven: set[int], slack_ns: int) -> dict[int, tuple[int, str]]:
    """Absent ranks others wait on whose silence a proven culprit explains: rank -> (culprit, why).

    ``slack_ns``: how long before the culprit stopped the absent rank may have last been seen
    and still count as having kept pace (the job's stall threshold).
    """
    out: dict[int, tuple[int, str]] = {}
    for m in absent:
        seen = last_seen_ns(job, m)
        if seen is None or own_fault(job, m):
            continue
        for c in sorted(proven):
            dump = job.dumps.get(c)
            shared = _shared_group(job, m, c)
            if dump is None or shared is None or not dump.latest_ns:
                continue
            gap_s = (dump.latest_ns - seen) / 1e9
            if seen >= dump.latest_ns - slack_ns:
                how = (f"{gap_s:.2f} s before rank {c}'s last recorded activity" if gap_s > 0
                       else "as late as rank {c}'s last recorded activity".format(c=c))
                out[m] = (c, f"there is no readable dump from rank {m}; it shares {shared} with rank {c}, and its "
                             f"peers' records show it kept pace until {how}: it most likely waits on rank {c} "
                             "like its peers, so it is reported, not blamed")
                break
    return out


def last_seen_ns(job: Job, rank: int) -> int | None:
    """The latest enqueue time of any collective or send/recv that ``rank``'s peers completed with it
    (a collective completes only once every member is in it): when it was last seen at work."""
    latest = 0
    for pg in job.groups.values():
        if rank not in pg.ranks or len(pg.ranks) < 2:
            continue
        me = pg.ranks.index(rank) if pg.membership == MembershipSource.PG_CONFIG else None
        for q in pg.ranks:
            d = job.dumps.get(q)
            h = d.histories.get(pg.name) if d is not None else None
            if h is None:
                continue
            at = h.completed.rfind(1)
            if at >= 0 and not pg.has_p2p:
                latest = max(latest, h.created_ns[at])
            if me is None:
                continue
            for name, ch in h.p2p.items():
                p2p = p2p_name(name)
                if p2p is None or p2p.peer != me:
                    continue
                at = ch.done.rfind(1)
                if at >= 0:
                    latest = max(latest, ch.created_ns[at])
    return latest or None


def _shared_group(job: Job, a: int, b: int) -> str | None:
    """The label of a group both ranks belong to (the smallest: the closest tie), or None."""
    shared = [pg for pg in job.groups.values() if a in pg.ranks and b in pg.ranks]
    if not shared:
        return None
    pg = min(shared, key=lambda g: (len(g.ranks), g.name))
    return pg.label
