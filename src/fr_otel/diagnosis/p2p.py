"""Send/recv: pair each pending op with its counterpart and say who waits on whom.

Within a group, the k-th ``send a->b`` of local rank a pairs with the k-th
``recv b<-a`` of local rank b (PyTorch's analyzer pairs them the same way); local
ranks map to global ranks through the group's members. When both ranks' dumps
hold their whole history (record ids start at 0) the pairing is by absolute
order; otherwise (a wrapped ring, an only-active dump) completed ops are taken as
paired and the pending ones pair in order. ``recv b<-?`` (any source) takes any
pending send to b that no specific recv took. Then, per pending op:

- its counterpart was never posted: a wait edge to the peer (``not_enqueued``;
  ``missing_dump`` when the peer's dump is absent);
- the peer completed the counterpart, this rank did not: its device or network
  stalled (``not_completed``, direct);
- both posted, neither completed: stuck inside the transfer, blamed like a
  collective every member entered (a mutual edge and a note, no culprit alone).

Matched pairs whose sizes or dtypes differ are a ``mismatch`` with both calls in
the evidence. p2p counters are never compared across ranks (they are per rank).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from ..read.dump import Entry, P2PChannel
from ..read.entry_rules import p2p_name
from .job import Job, ProcessGroup
from .kinds import CulpritKind
from .mismatch import describe_call
from .pace import Clock
from .verdict import Evidence
from .waits import WaitGraph

__all__ = ["P2PFindings", "add_p2p_waits"]



@dataclass(slots=True)
class P2PFindings:
    """What the send/recv analysis adds besides wait edges."""

    mismatches: list[tuple[int, Evidence]] = field(default_factory=list)
    pending: int = 0  # send/recv in flight anywhere (work is stuck: never "healthy")


@dataclass(slots=True)
class _Op:
    rank: int  # global rank that posted it
    peer: int | None  # global rank of the other side; None for any source
    name: str  # "send 1->2"
    index: int  # position within its channel
    done: bool
    created_ns: int
    fingerprint: int


@dataclass(slots=True)
class _Channel:
    """One rank's ops of one channel; :class:`_Op` objects are built only where they are needed."""

    rank: int
    peer: int | None
    name: str
    ch: P2PChannel

    def __len__(self) -> int:
        return len(self.ch.done)

    @property
    def first_pending(self) -> int:
        """Index of the oldest pending op (len if none): everything before it completed."""
        at = self.ch.done.find(0)
        return len(self) if at < 0 else at

    def ops(self, start: int = 0) -> list[_Op]:
        ch = self.ch
        return [_Op(self.rank, self.peer, self.name, start + i, bool(d), c, f)
                for i, (d, c, f) in enumerate(zip(ch.done[start:], ch.created_ns[start:], ch.fingerprint[start:]))]


_NONE = _Channel(-1, None, "", P2PChannel(b"", array("q"), array("q")))  # a channel never posted


def add_p2p_waits(job: Job, graph: WaitGraph, evidence: dict[int, list[Evidence]], clock: Clock) -> P2PFindings:
    """Pair send/recv in every group that carries them; add edges, direct evidence, mismatches.
    A pending op counts only once it is old enough to be a stall (``clock``)."""
    found = P2PFindings()
    for pg in job.ordered_groups():
        if pg.has_p2p:
            _group(job, pg, graph, evidence, found, clock)
    return found


def _group(job: Job, pg: ProcessGroup, graph: WaitGraph, evidence: dict[int, list[Evidence]],
           found: P2PFindings, clock: Clock) -> None:
    members = pg.ranks
    sends: dict[tuple[int, int], _Channel] = {}
    recvs: dict[tuple[int, int], _Channel] = {}
    any_recvs: dict[int, _Channel] = {}
    for rank in members:
        dump = job.dumps.get(rank)
        h = dump.histories.get(pg.name) if dump is not None else None
        if h is None:
            continue
        for name, ch in h.p2p.items():
            parsed = p2p_name(name)
            if parsed is None:
                continue
            kind, me, other = parsed
            if me >= len(members) or members[me] != rank:
                continue  # the recorded local rank does not fit the member list: do not guess
            if other is None:
                any_recvs[rank] = _Channel(rank, None, name, ch)
                continue
            if other >= len(members):
                continue
            peer = members[other]
            if kind == "send":
                sends[(rank, peer)] = _Channel(rank, peer, name, ch)
            else:
                recvs[(peer, rank)] = _Channel(rank, peer, name, ch)

    leftover_sends: dict[int, list[_Op]] = {}
    for src, dst in sorted(set(sends) | set(recvs)):
        s_ch, r_ch = sends.get((src, dst), _NONE), recvs.get((src, dst), _NONE)
        absolute = (dst not in any_recvs and _from_start(job, src) and _from_start(job, dst))
        if not absolute and s_ch.first_pending == len(s_ch) and r_ch.first_pending == len(r_ch):
            continue  # nothing pending on either side (the common case, at C speed)
        if absolute:
            s_ops, r_ops = s_ch.ops(), r_ch.ops()
            pairs = list(zip(s_ops, r_ops))
            rest_s, rest_r = s_ops[len(r_ops):], r_ops[len(s_ops):]
        else:
            ps, pr = s_ch.ops(s_ch.first_pending), r_ch.ops(r_ch.first_pending)
            pairs = list(zip(ps, pr))
            rest_s, rest_r = ps[len(pr):], pr[len(ps):]
        for s, r in pairs:
            _pair(job, pg, s, r, graph, evidence, found, clock)
        leftover_sends.setdefault(dst, []).extend(s for s in rest_s if not s.done)
        for r in rest_r:
            if not r.done:
                _unmatched(job, pg, r, src, graph, found, clock)

    for dst, anys in sorted(any_recvs.items()):
        waiting = sorted(leftover_sends.pop(dst, []), key=lambda o: o.created_ns)
        pending = anys.ops(anys.first_pending)
        for s, r in zip(waiting, pending):
            _pair(job, pg, s, r, graph, evidence, found, clock)
        leftover_sends[dst] = waiting[len(pending):]
        for r in pending[len(waiting):]:
            if not r.done:
                _unmatched(job, pg, r, None, graph, found, clock)
    for dst, left in sorted(leftover_sends.items()):
        for s in left:
            _unmatched(job, pg, s, dst, graph, found, clock)


def _from_start(job: Job, rank: int) -> bool:
    dump = job.dumps.get(rank)
    return dump is not None and dump.from_start


def _entry(job: Job, op: _Op) -> Entry | None:
    dump = job.dumps.get(op.rank)
    if dump is None:
        return None
    for e in dump.tail:  # pending ops are all in the tail; the enqueue time tells them apart
        if e.is_p2p and e.time_created_ns == op.created_ns and e.op == op.name:
            return e
    return None


def _call(job: Job, op: _Op) -> str:
    """``send 1->2 [4096,1,5120] BFloat16``: the op's own fingerprint says it."""
    fp = job.dumps[op.rank].fingerprints.get(op.fingerprint)
    return describe_call(fp) if fp else op.name


def _shape(job: Job, op: _Op) -> tuple[Any, ...]:
    fp = job.dumps[op.rank].fingerprints.get(op.fingerprint)
    if not fp:
        return ()
    _, in_sizes, in_dtypes, out_sizes, out_dtypes = fp
    return (in_sizes or out_sizes, in_dtypes or out_dtypes)


def _pair(job: Job, pg: ProcessGroup, s: _Op, r: _Op, graph: WaitGraph, evidence: dict[int, list[Evidence]],
          found: P2PFindings, clock: Clock) -> None:
    if _shape(job, s) != _shape(job, r) and _shape(job, s) and _shape(job, r):
        text = (f"on {pg.label}, rank {s.rank}'s {_call(job, s)} met rank {r.rank}'s {_call(job, r)} "
                "(a matched send/recv pair whose sizes or dtypes differ; the dumps cannot tell which side is wrong)")
        for who, other in ((s, r), (r, s)):
            found.mismatches.append((who.rank, Evidence(CulpritKind.MISMATCH, pg.name, None, text, (other.rank,), False,
                                                        True, op=_profiling(job, who), peer=other.rank, p2p=True)))
    if s.done and r.done:
        return
    if s.done != r.done:
        stuck, other = (r, s) if s.done else (s, r)
        if not clock.stuck(stuck.created_ns, stuck.rank, what=f"{stuck.name} on {pg.label}"):
            return
        found.pending += 1
        evidence.setdefault(stuck.rank, []).append(Evidence(
            CulpritKind.NOT_COMPLETED, pg.name, None,
            f"rank {stuck.rank} posted {stuck.name} on {pg.label} but has not completed it, while rank "
            f"{other.rank} completed the matching {other.name}: its device or network stalled",
            (), True, True, op=_profiling(job, stuck), peer=other.rank, p2p=True))
        return
    both = max(s.created_ns, r.created_ns)  # the transfer could start once both were posted
    if not clock.stuck(both, s.rank, clock.earliest((r.rank,)), what=f"{s.name} / {r.name} on {pg.label}"):
        return
    found.pending += 1
    hub = (pg.name, None, f"p2p {s.rank}>{r.rank} {s.index}")
    note = (f"group {pg.label}: rank {s.rank} posted {s.name} and rank {r.rank} the matching {r.name}, and "
            "neither completed; the transfer itself is stuck (device or network) and the recorder cannot single "
            "out a rank")
    for me, other in ((s, r), (r, s)):
        graph.add_mutual(me.rank, [other.rank], hub, f"{s.name} / {r.name} on {pg.label}", note,
                         op={s.rank: _profiling(job, s), r.rank: _profiling(job, r)})


def _unmatched(job: Job, pg: ProcessGroup, op: _Op, peer: int | None, graph: WaitGraph,
               found: P2PFindings, clock: Clock) -> None:
    """A pending op whose counterpart was never posted: the poster waits on the peer."""
    counterpart = "recv" if op.name.startswith("send") else "send"
    where = pg.label
    call = op.name + (" (any source)" if peer is None else "")
    targets = [peer] if peer is not None else [q for q in pg.ranks if q != op.rank]
    present = [q for q in targets if q in job.dumps]
    absent = [q for q in targets if q not in job.dumps]
    if not clock.stuck(op.created_ns, op.rank, clock.earliest(present), what=f"{call} on {where}"):
        return
    found.pending += 1
    prof = _profiling(job, op)
    if present:
        key = (pg.name, None, f"p2p {op.rank} {op.name} {op.index}")
        graph.add(op.rank, key, present, CulpritKind.NOT_ENQUEUED,
                  lambda q, w: f"rank(s) {w} wait in {call} {_dir(call)} rank {q} on "
                  f"{where}; rank {q} never posted the matching {counterpart}", op=prof, since_ns=op.created_ns)
    if absent:
        key = (pg.name, None, f"p2p-missing {op.rank} {op.name} {op.index}")
        graph.add(op.rank, key, absent, CulpritKind.MISSING_DUMP,
                  lambda q, w: f"rank(s) {w} wait in {call} {_dir(call)} rank {q} on {where}; "
                  f"there is no dump from rank {q}, so whether it posted the matching op is unknown",
                  op=prof)


def _dir(call: str) -> str:
    return "to" if call.startswith("send") else "from"


def _profiling(job: Job, op: _Op) -> str:
    e = _entry(job, op)
    return e.profiling_name if e is not None else op.name
