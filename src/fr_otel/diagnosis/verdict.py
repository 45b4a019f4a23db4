"""What the analysis returns: the verdict, culprits with evidence, per-group state.

Plain data with ``to_dict()`` for the public JSON schema; no logic beyond formatting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..common.ranks import compress_ranks
from ..read.dump import Progress
from ..read.frame import Frame
from ..read.last_record import LastRecord
from ..read.live_stack import LiveStacks
from ..read.rank_process import RankProcess
from .hosts import HostFinding
from .job import Job, ProcessGroup, group_label
from .cause_kinds import Cause
from .kinds import KIND_ORDER, NOT_BLAMED, CulpritKind, VerdictWord
from .pace import Ages
from .stops import StopOrder, StopPoint

__all__ = [
    "DEFAULT_STRAGGLER_THRESHOLD_S", "KIND_ORDER", "NOT_BLAMED", "AnalysisOptions", "CulpritKind", "Evidence",
    "Culprit", "InFlight", "GroupState", "Incomplete", "StopOrder", "StopPoint", "UNKNOWN_STALL", "Verdict",
    "VerdictWord", "Waiting", "reference_ns",
]

DEFAULT_STRAGGLER_THRESHOLD_S = 0.05

#: Said wherever an age would be printed (the terminal, the page, the trace) when the dumps carry
#: no time of their own: the newest recorded activity is then the reference, and an age to it
#: (often a few ms) says nothing of how long the hang lasted.
UNKNOWN_STALL = "stall duration unknown (no dump time)"


def _where(name: str, desc: str, seq: int | None, op: str | None, p2p: bool) -> str:
    """``TENSOR_MODEL_PARALLEL_GROUP (37) #88684 nccl:_reduce_scatter_base``, or for send/recv
    ``PIPELINE_MODEL_PARALLEL_GROUP (57), send/recv nccl:send 0->1``: a culprit's and each of its
    related evidence's place, in the same words."""
    kind = ", send/recv" if p2p else ""
    return (f"{group_label(name, desc)}{f' #{seq}' if seq is not None else ''}{kind}"
            f"{f' {op}' if op else ''}")


@dataclass(frozen=True, slots=True)
class AnalysisOptions:
    """Knobs of the analysis (defaults suit real jobs)."""

    straggler_threshold_s: float = DEFAULT_STRAGGLER_THRESHOLD_S  # enqueue lateness (median; mean when bursty) of a straggler
    straggler_min_collectives: int = 5
    straggler_window: int = 256  # most recent collectives per group to judge skew on
    # The dumps were taken as the job ended (an uncaught exception, SIGTERM): nothing in flight will
    # finish, so every wait counts whatever its age (else ages are weighed: diagnosis.pace).
    ending: bool = False
    # The live agent raised this incident for a wait older than this (its stall threshold): a wait as
    # old is a stall, even where the pace learnt from a short or uneven history asks for more.
    raised_over_s: float | None = None
    # The live agent raised this incident for a slow host while the job ran, no wait past its stall threshold
    # (this): a wait younger than that is the job's slowness caught mid-step, never a hang, however fast the
    # learnt pace (a rank starved of CPU for a moment looks stuck against a 50 ms step); a wait whose age a
    # compact recorder cannot tell is not counted stuck either (the agents' stall detectors had not fired).
    running_stall_s: float | None = None
    # Undated dumps count every wait as stuck, as if the job had stopped when dumped (never measured to the newest
    # activity, see diagnosis.pace): what a hang would blame, said beside an undated snapshot's verdict.
    undated_waits_stuck: bool = False


@dataclass(frozen=True, slots=True)
class Evidence:
    """One reason to suspect a rank: what it did (not) do, where."""

    kind: CulpritKind
    group: str  # group name
    seq: int | None
    text: str
    waiting: tuple[int, ...] = ()  # ranks directly waiting on this one here
    sole: bool = False  # the only rank the waiting ranks wait for here
    direct: bool = False  # seen in the rank's own state, not inferred from who waits on it
    op: str | None = None  # the call (``nccl:all_reduce``, ``nccl:send 1->2``), where its entries say
    peer: int | None = None  # the other side's global rank of a send/recv
    desc: str = ""  # the group's desc (filled with the culprit record)
    p2p: bool = False  # point-to-point evidence (a send/recv), not a collective
    since_ns: int | None = None  # when its first waiter began waiting here (the critical path's first wait first)

    @property
    def where(self) -> str:
        """The group (desc and name), sequence number and call, as the culprit's own are said."""
        return _where(self.group, self.desc, self.seq, self.op, self.p2p)

    def to_dict(self) -> dict[str, Any]:
        """A related item of the JSON schema: the keys a culprit has for its own evidence, same shapes."""
        return {"kind": self.kind, "process_group": {"name": self.group, "desc": self.desc},
                "collective_seq_id": self.seq, "evidence": self.text, "op": self.op,
                "waiting_ranks": list(self.waiting), "peer": self.peer}


@dataclass(frozen=True, slots=True)
class Culprit:
    """A rank the others wait for, with its strongest evidence first."""

    rank: int
    kind: CulpritKind
    group_name: str
    group_desc: str
    collective_seq_id: int | None
    evidence: str
    op: str | None
    waiting_ranks: tuple[int, ...]
    last_frame: Frame | None
    related: tuple[Evidence, ...] = ()
    peer: int | None = None  # point-to-point evidence: the global rank on the other side
    host: str | None = None  # where the rank ran, when anything says
    step: int | None = None  # the training step the rank is in (its own counter)
    collective_step: int | None = None  # the step the blamed collective belongs to
    stopped_ns: int | None = None  # its last recorded activity in the blamed groups (its own clock)
    stopped_after_s: float | None = None  # after the first culprit stopped; None when the order is unknown
    process: RankProcess | None = None  # where it runs, when known
    now: LiveStacks | None = None  # its threads' stacks at incident time (live agent only)
    waits_on: tuple[int, ...] = ()  # kind "unknown": the culprit(s) that explain its silence
    p2p: bool = False  # its strongest evidence is a send/recv, not a collective
    cause: Cause | None = None  # why it stopped (:mod:`.cause`)
    #: It sent nothing: its dump is its node-local last record (:mod:`fr_otel.read.last_record`), this old.
    record: LastRecord | None = None

    @property
    def blamed(self) -> bool:
        """A culprit, not merely reported (``unknown``)."""
        return self.kind not in NOT_BLAMED

    @property
    def node(self) -> str | None:
        """The scheduler's (Slurm's) node name, when the rank's process says one."""
        return self.process.node if self.process is not None else None

    @property
    def group_label(self) -> str:
        """Its blamed group as people know it (:func:`fr_otel.diagnosis.job.group_label`)."""
        return group_label(self.group_name, self.group_desc)

    @property
    def where(self) -> str:
        """Blamed group, sequence number and call: ``EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP (94) #3429 nccl:_all_gather_base``."""
        return _where(self.group_name, self.group_desc, self.collective_seq_id, self.op, self.p2p)

    def now_dict(self) -> dict[str, Any] | None:
        """The JSON ``now`` key: where the rank runs and what its main thread is doing."""
        if self.now is None and self.process is None:
            return None
        out: dict[str, Any] = dict(self.process.as_json()) if self.process is not None else {}
        if self.now is not None:
            where = self.now.where
            main = self.now.main
            out.update({
                "captured_ns": self.now.captured_ns,
                "doing": self.now.doing,
                "in_collective": self.now.in_collective,
                "where": where._asdict() if where else None,
                "frames": [f._asdict() for f in main.frames] if main else [],
                "threads": [{"name": t.name, "frames": [f._asdict() for f in t.frames]} for t in self.now.threads[1:]],
            })
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "kind": self.kind,
            "process_group": {"name": self.group_name, "desc": self.group_desc},
            "collective_seq_id": self.collective_seq_id,
            "evidence": self.evidence,
            "op": self.op,
            "waiting_ranks": list(self.waiting_ranks),
            "peer": self.peer,
            "last_frame": self.last_frame._asdict() if self.last_frame else None,
            "related": [e.to_dict() for e in self.related],
            "host": self.host,
            "node": self.node,
            "step": self.step,
            "collective_step": self.collective_step,
            "stopped_ns": self.stopped_ns,
            "stopped_after_s": self.stopped_after_s,
            "now": self.now_dict(),
            "waits_on": list(self.waits_on),
            "cause": self.cause.to_dict() if self.cause is not None else None,
            "record": self.record_dict(),
        }

    def record_dict(self) -> dict[str, Any] | None:
        """Its last record's times (it sent nothing: its kind comes from that record); None for a rank that answered."""
        r = self.record
        return None if r is None else {"taken_ns": r.as_of_ns, "age_s": r.age_s, "silent_since_ns": r.silent_since_ns}


@dataclass(slots=True)
class InFlight:
    """The oldest collective of a group that some member has not completed."""

    seq: int
    op: str | None
    since_ns: int | None  # earliest enqueue among the ranks that entered it
    entered: tuple[int, ...]
    not_entered: tuple[int, ...]  # members known (from their own dump) not to have enqueued it
    timeout_ms: int | None
    unknown: tuple[int, ...] = ()  # members whose state is unknown: no dump, or no record of the group
    step: int | None = None  # the training step it belongs to, when steps were counted


@dataclass(slots=True)
class GroupState:
    """Per group: how far each member enqueued and completed, and what is in flight."""

    group: ProcessGroup
    progress: dict[int, Progress | None]
    in_flight: InFlight | None = None
    note: str | None = None

    def to_dict(self, latest_ns: int | None) -> dict[str, Any]:
        """The JSON shape; ``latest_ns``: when the dumps were written (None: ages unknown)."""
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
                "unknown": list(f.unknown),
                "timeout_ms": f.timeout_ms,
                "step": f.step,
            }
        return out


@dataclass(frozen=True, slots=True)
class Waiting:
    """Ranks that wait only because of culprits, and the culprit(s) their waits lead to."""

    ranks: tuple[int, ...]
    waits_on: tuple[int, ...]

    @property
    def text(self) -> str:
        """``waits on rank 30`` / ``waits on ranks 9 and 22``."""
        if len(self.waits_on) == 1:
            return f"waits on rank {self.waits_on[0]}"
        if len(self.waits_on) == 2:
            return f"waits on ranks {self.waits_on[0]} and {self.waits_on[1]}"
        return f"waits on ranks {compress_ranks(self.waits_on)}"

    def sentence(self) -> str:
        """``ranks 0-29,31 wait on rank 30``."""
        if len(self.ranks) == 1:
            return f"rank {self.ranks[0]} {self.text}"
        return f"ranks {compress_ranks(self.ranks)} wait" + self.text[len("waits"):]

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "waits_on": list(self.waits_on), "text": self.text}


@dataclass(frozen=True, slots=True)
class Incomplete:
    """Fewer than half the ranks' dumps are present: who is seen waiting, whose dumps are absent."""

    dumps_present: int
    world_size: int
    waiting_ranks: tuple[int, ...]
    missing_ranks: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"dumps_present": self.dumps_present, "world_size": self.world_size,
                "waiting_ranks": list(self.waiting_ranks), "missing_ranks": list(self.missing_ranks)}


@dataclass(slots=True)
class Verdict:
    """The answer: one word, the culprits with evidence, and what limited it."""

    verdict: VerdictWord
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
    incomplete: Incomplete | None = None  # set when too few dumps are present to name anyone
    stop_order: StopOrder | None = None  # culprits by when they stopped (hang verdicts only)
    nodes: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)  # nodes (else hosts) with several culprits
    hosts: list[HostFinding] = field(default_factory=list)  # hosts lost, cut off, or holding culprits
    steps: dict[int, int] = field(default_factory=dict)  # rank -> training step it is in, where counted
    ages: Ages | None = None  # how old what was in flight was, against the job's pace
    waiting: list[Waiting] = field(default_factory=list)  # ranks stuck only behind the culprits
    job_ended: bool = False  # the incident was raised as the job ended (uncaught exception, SIGTERM)

    @property
    def blamed(self) -> list[Culprit]:
        """The culprits, without the ranks only reported (``unknown``)."""
        return [c for c in self.culprits if c.blamed]

    @property
    def dated(self) -> bool:
        """The reference time is when the dumps were written, so an age to it is how long an op
        has been in flight. Otherwise it is the newest recorded activity: see :data:`UNKNOWN_STALL`."""
        return self.reference_source == "dump_files" and bool(self.reference_ns)

    def age_ns(self, since_ns: int | None) -> int | None:
        """How long before the dumps were written ``since_ns`` was; None when not known (no time
        recorded, or the dumps not dated: the one rule every age printed follows)."""
        if not since_ns or not self.dated or self.reference_ns is None:
            return None
        return self.reference_ns - since_ns

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
            "incomplete": self.incomplete.to_dict() if self.incomplete else None,
            "stop_order": self.stop_order.to_dict() if self.stop_order is not None else None,
            "nodes": [{"host": h, "ranks": list(r)} for h, r in self.nodes],  # h: the node name where known
            "hosts": [h.to_dict() for h in self.hosts],
            "steps": {"known": bool(self.steps), "by_rank": {str(r): s for r, s in sorted(self.steps.items())}},
            "ages": self.ages.to_dict() if self.ages is not None else None,
            "waiting": [w.to_dict() for w in self.waiting],
            "job_ended": self.job_ended,
        }
        if include_groups:
            out["groups"] = [g.to_dict(self.reference_ns if self.dated else None) for g in self.groups]
        return out


def reference_ns(verdict: Verdict, job: Job) -> int:
    """"Now" for ages and for ops still in flight, the same for the report and the trace:
    the verdict's reference time (when the dumps were written, else the newest activity),
    else (a verdict made without one) the newest activity any dump records; 0 when no dump
    records a time."""
    return verdict.reference_ns or job.latest_ns
