"""Cross-rank analysis: who are the others waiting for, and why do we think so.

Blame is a graph question. Within each process group a rank with a collective
in flight *waits for* every member that has not enqueued it yet. Across groups
those waits chain (a rank missing from the world all_reduce may itself be
stuck waiting for someone in its tensor-parallel group), so the culprits are
the ranks at the end of the chains: waited for, and waiting for no one. Added
to them: ranks that enqueued a collective their peers completed but did not
complete it (their device or network stalled), the minority of a mismatch
(same sequence number, different op / sizes / dtypes), and, when nothing hangs,
a rank that consistently enqueues last (a straggler). Everything here returns
data; printing is the CLI's job.
"""

from __future__ import annotations

from dataclasses import replace

from ..common.ranks import compress_ranks
from .cascade import explained_absences, own_fault, waiting_on
from .cause import with_causes
from .failure import job_ended, raised_ranks
from .culprit_record import culprit_record
from .hosts import NetworkCall, host_findings, judge_network
from .job import Job, ProcessGroup
from .kinds import KIND_ORDER, CulpritKind, VerdictWord
from .mismatch import find_mismatches
from .mixed_incidents import mixed_incidents
from .p2p import add_p2p_waits
from .recorded import adopt_recorded, recorded_collective_steps
from .pace import DAY_NS, Clock
from .step_map import step_of_collective
from .stop_order import order_stops
from .straggler import find_stragglers
from .undated import scattered, undated_note
from .verdict import (
    AnalysisOptions,
    Culprit,
    Evidence,
    GroupState,
    Incomplete,
    InFlight,
    StopOrder,
    Verdict,
)
from .waits import WaitGraph, add_waits

# The result types (Verdict, Culprit, GroupState, AnalysisOptions, ...) have one home: .verdict.
__all__ = ["analyze"]


def analyze(job: Job, options: AnalysisOptions | None = None) -> Verdict:
    """Name the culprit ranks of ``job``, with evidence; pure function of the dumps."""
    options = options or AnalysisOptions()
    reference, reference_source = _reference_time(job)
    states = [_group_state(job, pg) for pg in job.ordered_groups()]
    notes: list[str] = [s.note for s in states if s.note and s.in_flight is not None]
    evidence: dict[int, list[Evidence]] = {}

    clock = Clock.of(job, weigh=not options.ending, infer=not options.undated_waits_stuck,
                     raised_over_s=options.raised_over_s,
                     running_stall_s=options.running_stall_s)
    as_stopped: Verdict | None = None  # undated dumps of a job at work: the verdict had it stopped when dumped
    straggling: list[int] = []  # ... whose waits converge on ranks late step after step
    if clock.at_work_ns is not None and not options.undated_waits_stuck:
        as_stopped = analyze(job, replace(options, undated_waits_stuck=True))
        stopped_on = [c.rank for c in as_stopped.culprits if c.blamed]
        if not (as_stopped.verdict == VerdictWord.HANG and scattered(job, stopped_on)):
            hang = as_stopped.verdict == VerdictWord.HANG and stopped_on
            late = {r for r, _ in find_stragglers(job, options)} if hang else set()
            if not (hang and set(stopped_on) <= late):  # a hang's shape, a desync (or nothing to weigh): as stopped
                as_stopped.notes.append(undated_note(job, clock, as_stopped, as_stopped.verdict, "stopped"))
                return as_stopped
            straggling = stopped_on
    if options.ending:
        notes.append("the dumps were taken as the job ended: every wait counts, whatever its age")
    graph = WaitGraph()
    for state in states:
        add_waits(job, state, graph, evidence, clock)
    p2p = add_p2p_waits(job, graph, evidence, clock)

    mismatch = find_mismatches(job) + p2p.mismatches
    for rank, ev in mismatch:
        evidence.setdefault(rank, []).append(ev)
    # Proven causes: a device that stalled, a call that differs. What they wait on is a consequence,
    # and a collective or transfer they are stuck inside with others waits on them alone.
    graph.stalled = {r for r, evs in evidence.items()
                     if any(e.kind == CulpritKind.MISMATCH or (e.kind == CulpritKind.NOT_COMPLETED and e.direct)
                            for e in evs)}
    graph.explain_mutual(graph.stalled)
    culprits_from_graph, cycle_notes = graph.culprits()
    notes.extend(cycle_notes)
    hang_culprits = set(culprits_from_graph) | {
        r for r, evs in evidence.items() if any(e.kind == CulpritKind.NOT_COMPLETED for e in evs)
    }
    for rank in culprits_from_graph:
        evidence.setdefault(rank, []).extend(graph.evidence_for(rank))

    mismatch_culprits = {r for r, _ in mismatch}
    chosen = hang_culprits | mismatch_culprits
    stuck = any(_stalled(s, clock) for s in states) or p2p.pending > 0
    verdict: VerdictWord
    if mismatch_culprits:
        verdict = VerdictWord.DESYNC
    elif hang_culprits:
        verdict = VerdictWord.HANG
    elif stuck or graph.unexplained:
        verdict = VerdictWord.INCONCLUSIVE
        notes.extend(graph.unexplained)
        if p2p.pending:
            notes.append(f"{p2p.pending} send/recv pair(s) or op(s) in flight, and no rank can be singled out "
                         "as the one the others wait on")
    else:
        stragglers = find_stragglers(job, options)
        for rank, ev in stragglers:
            evidence.setdefault(rank, []).append(ev)
        chosen = {r for r, _ in stragglers}
        verdict = VerdictWord.STRAGGLER if chosen else VerdictWord.HEALTHY
        oldest = clock.oldest_young()  # None when nothing in flight is young
        if oldest is not None:
            notes.append(_young_note(clock, oldest))
    if as_stopped is not None:  # without dump times a hang dumped at once cannot be ruled out: never healthy
        verdict = VerdictWord.INCONCLUSIVE if verdict == VerdictWord.HEALTHY else verdict
    stall_ns = min((s.in_flight.since_ns for s in states if s.in_flight and s.in_flight.since_ns), default=None)
    call = judge_network(job)
    if call.explains:
        verdict, chosen = _apply_network(job, call, states, evidence, chosen, verdict, notes)
    elif verdict in (VerdictWord.HEALTHY, VerdictWord.STRAGGLER) and job.missing_ranks:
        notes.append(f"rank(s) {compress_ranks(job.missing_ranks)} left no dump: their state is unknown, so the job "
                     "is not called healthy")
        verdict, chosen = VerdictWord.INCONCLUSIVE, set()
    if as_stopped is not None:  # said as the verdict finally stands
        notes.append(undated_note(job, clock, as_stopped, verdict, "straggler" if straggling else "snapshot",
                                  straggling))
    incomplete = None
    if (job.world_size and 2 * len(job.dumps) < job.world_size
            and verdict in (VerdictWord.HANG, VerdictWord.STRAGGLER, VerdictWord.HEALTHY)
            and not call.explains):
        seen_waiting = tuple(sorted({w for w, hubs in graph.edges.items() if isinstance(w, int) and hubs}
                                    | {r for s in states if s.in_flight for r in s.in_flight.entered}))
        incomplete = Incomplete(len(job.dumps), job.world_size, seen_waiting, job.missing_ranks)
        suspects = f"; the analysis would point at rank(s) {compress_ranks(sorted(chosen))}" if chosen else ""
        notes.append(
            f"evidence incomplete: only {len(job.dumps)} of {job.world_size} ranks' dumps are present "
            f"(missing: {compress_ranks(job.missing_ranks)}); rank(s) {compress_ranks(seen_waiting) or 'none'} "
            f"are seen waiting{suspects}, but the absent ranks' state is unknown"
        )
        verdict, chosen = VerdictWord.INCONCLUSIVE, set()
    if len(job.dumps) < 2 and verdict in (VerdictWord.HEALTHY, VerdictWord.STRAGGLER):
        verdict = VerdictWord.INCONCLUSIVE
        notes.append("fewer than two ranks' dumps: nothing to compare across ranks")
    if verdict in (VerdictWord.HEALTHY, VerdictWord.INCONCLUSIVE) and "gloo" in job.backends and not chosen:
        notes.append("gloo records no send/recv: a hang in point-to-point ops would not show in these dumps")
    if verdict == VerdictWord.INCONCLUSIVE and not notes:
        notes.append("no rank is waiting on another in the recorded collectives")

    raised = raised_ranks(job)
    # Its own code ended it: a failure, never healthy or hang. A stuck shape is one too where every rank has left,
    # or where the incident was raised as the job ended and a rank the others wait on raised (the hang is its
    # exception's sequel); a waiter that raised while another rank hangs leaves the hang standing.
    if raised and (not verdict.stuck or job_ended(job) or (options.ending and chosen & set(raised))):
        verdict, chosen = VerdictWord.FAILURE, set(raised)
        for rank in raised:
            leaving = job.exits[rank]
            where = f" at {leaving.where}" if leaving.where else ""
            evidence.setdefault(rank, []).append(Evidence(
                CulpritKind.NOT_ENQUEUED, next(iter(job.groups), ""), None,
                f"rank {rank} raised {leaving.type or 'an exception'}: {leaving.message}{where}, and left the job",
                direct=True))
        notes.append("the job ended: rank(s) " + compress_ranks(raised) + " raised an exception of their own code")
    faulted = _own_faults(job, states, chosen) if verdict.stuck else {}
    for rank, ev in faulted.items():
        evidence.setdefault(rank, []).append(ev)
    # A rank that faulted while it waited explains no one's silence: only the ranks the others wait on do.
    unknown = _explained_absences(job, graph, chosen, clock) if verdict.stuck else {}
    chosen |= set(faulted)
    culprits = [culprit_record(job, rank, evidence[rank], unknown.get(rank)) for rank in sorted(chosen)]
    # The ranks the others wait on first (they stopped first), then those that faulted on their own while waiting.
    culprits.sort(key=lambda c: (c.rank in faulted, KIND_ORDER.index(c.kind), c.rank))
    if verdict == VerdictWord.FAILURE:  # the first to raise first
        culprits.sort(key=lambda c: raised.index(c.rank))
    blamed = [c for c in culprits if c.blamed]
    steps = {r: d.steps.step for r, d in job.dumps.items() if d.steps is not None}
    for state in states:
        if state.in_flight is not None and steps:
            state.in_flight.step = step_of_collective(job, state.group.name, state.in_flight.seq)
    stop = order_stops(job, blamed, job.hosts) if verdict == VerdictWord.HANG and blamed else None
    culprits = _placed(job, culprits, stop, steps)
    waiting = (waiting_on(graph, {c.rank for c in blamed}, {c.rank for c in culprits})
               if verdict.stuck else [])
    if verdict.stuck and not steps:
        notes.append("training step unknown: no rank counted steps (the live agent does; offline, a steps.json "
                     "beside the dumps)")
    by_host: dict[str, list[int]] = {}  # by node: the scheduler's node name where known, else the host
    for c in culprits:
        if not c.blamed:
            continue
        place = c.node or c.host
        if place:
            by_host.setdefault(place, []).append(c.rank)
    hosts = host_findings(job, {c.rank: c.kind for c in blamed}, call, stall_ns, _group_steps(job, states, culprits))
    culprits = with_causes(culprits, job.host_facts, job.exits, hosts)
    return adopt_recorded(job, Verdict(
        verdict=verdict,
        culprits=culprits,
        ranks_loaded=len(job.dumps),
        world_size=job.world_size,
        problems=[*job.problems, *filter(None, [mixed_incidents(job.dumps)])],
        notes=_dedupe(notes),
        groups=states,
        missing_ranks=job.missing_ranks,
        reference_ns=reference,
        reference_source=reference_source,
        backends=tuple(sorted(job.backends)),
        incomplete=incomplete,
        stop_order=stop,
        nodes=[(h, tuple(sorted(r))) for h, r in sorted(by_host.items()) if len(r) > 1],
        hosts=hosts,
        steps=steps,
        ages=clock.summary(),
        waiting=waiting,
        job_ended=options.ending,
    ))


def _apply_network(job: Job, call: NetworkCall, states: list[GroupState], evidence: dict[int, list[Evidence]],
                   chosen: set[int], verdict: VerdictWord, notes: list[str]) -> tuple[VerdictWord, set[int]]:
    """Culprits from what the network says (see :mod:`.hosts`): this node cut off, the store's host
    lost, or lost hosts; missing ranks on hosts that still answer are reported, not blamed, and a
    rank merely behind its peers (not enqueued yet, no proven fault of its own) is their sequel."""
    stuck = next((s for s in states if s.in_flight and s.in_flight.entered), None)
    group = stuck.group.name if stuck else (next(iter(job.groups)) if job.groups else "")
    seq = stuck.in_flight.seq if stuck and stuck.in_flight else None
    waiting = stuck.in_flight.entered if stuck and stuck.in_flight else ()
    hosts = job.hosts
    missing = set(job.missing_ranks)

    def report_only(rank: int, text: str) -> None:
        evidence[rank] = [Evidence(CulpritKind.UNKNOWN, group, seq, text)]
        chosen.add(rank)

    if call.cut_off is not None:
        here = sorted(r for r in job.dumps if hosts.get(r) == call.cut_off)
        for rank in here:
            evidence.setdefault(rank, []).insert(0, Evidence(
                CulpritKind.NOT_COMPLETED, group, seq, f"rank {rank} on {call.cut_off}: {call.why[call.cut_off]}",
                direct=True))
        if missing:  # not culprits: from a node cut off, nothing is known of them (their hosts say so)
            away = sorted({hosts.get(r) or "an unknown host" for r in missing})
            notes.append(f"rank(s) {compress_ranks(sorted(missing))} on {', '.join(away[:6])}: unreachable from "
                         f"here ({call.cut_off} is cut off), not culprits: their state is unknown")
        return VerdictWord.HANG, set(here)
    suspects = ([call.store_lost] if call.store_lost is not None else []) + list(call.lost)
    for host in suspects:
        for rank in sorted(r for r in missing if hosts.get(r) == host):
            evidence[rank] = [Evidence(CulpritKind.MISSING_DUMP, group, seq,
                                       f"rank {rank} left no dump: {call.why[host]}",
                                       waiting, sole=len(suspects) == 1)] + [
                e for e in evidence.get(rank, []) if e.kind != CulpritKind.MISSING_DUMP]
            chosen.add(rank)
    for rank in sorted(missing - {r for r in missing if hosts.get(r) in suspects}):
        if rank in call.alive_elsewhere or call.store_lost is not None:
            report_only(rank, f"rank {rank} on {hosts.get(rank) or 'an unknown host'}: no dump here"
                              + (", but its host's agent answers: alive elsewhere" if rank in call.alive_elsewhere
                                 else "; its state is unknown"))
    behind = sorted(r for r in chosen if r in job.dumps and hosts.get(r) not in suspects
                    and all(e.kind in (CulpritKind.NOT_ENQUEUED, CulpritKind.STRAGGLER) for e in evidence.get(r, [])))
    if behind:
        chosen -= set(behind)
        notes.append(f"rank(s) {compress_ranks(behind)} had not yet enqueued what their peers wait in, with no fault "
                     f"of their own: the lost host(s) {', '.join(suspects)} explain the incident")
    return (verdict if verdict.stuck else VerdictWord.HANG), chosen


def _group_steps(job: Job, states: list[GroupState], culprits: list[Culprit]) -> dict[str, int | None]:
    """Per host, the step its ranks' group was in when they went silent: the step of the collective
    their peers wait in (their culprits' collective, else the oldest one in flight), from the peers'
    own step maps. A frozen or cut-off host's ranks count no step of their own after that."""
    flights = [s.in_flight for s in states if s.in_flight is not None and s.in_flight.step is not None]
    oldest = min(flights, key=lambda f: f.since_ns or 1 << 62, default=None)
    fallback = oldest.step if oldest is not None else None
    out: dict[str, int | None] = {}
    for c in culprits:
        host = job.hosts.get(c.rank)
        if host and c.collective_step is not None:
            out.setdefault(host, c.collective_step)
    return {h: out.get(h, fallback) for h in {*out, *(h for h in job.hosts.values() if h)}}


def _explained_absences(job: Job, graph: WaitGraph, chosen: set[int], clock: Clock) -> dict[int, tuple[int, str]]:
    """Absent culprits whose silence a proven culprit explains (see cascade); their waiters then
    wait on that culprit."""
    absent = sorted(r for r in chosen if r not in job.dumps)
    proven = {r for r in chosen if r in job.dumps}
    found = explained_absences(job, absent, proven, int(clock.threshold_s() * 1e9))
    for rank, (cause, _) in found.items():
        graph.add(rank, ("absent", None, str(rank)), [cause], CulpritKind.UNKNOWN, lambda q, w: "")
    return found


def _own_faults(job: Job, states: list[GroupState], chosen: set[int]) -> dict[int, Evidence]:
    """Ranks beside the culprits whose own process faulted (stopped, died) while they waited: culprits too, each
    with its own cause, after the ranks their peers wait on (they stopped later: a rank that stopped first is one
    of those)."""
    stuck = next((s for s in states if s.in_flight is not None), None)
    group = stuck.group.name if stuck is not None else ""
    seq = stuck.in_flight.seq if stuck is not None and stuck.in_flight is not None else None
    out: dict[int, Evidence] = {}
    for rank in sorted((set(job.host_facts) | set(job.exits)) - chosen):
        why = own_fault(job, rank)
        if why:
            # A rank known only from its node-local last record sent nothing: what that record caught it inside
            # is no wait of its own (docs/verdict.md), so it is never not_completed from it.
            dump = job.dumps.get(rank)
            kind = CulpritKind.NOT_COMPLETED if dump is not None and dump.record is None else CulpritKind.MISSING_DUMP
            out[rank] = Evidence(kind, group, seq, f"rank {rank} faulted on its own while it waited: {why}",
                                 direct=True)
    return out


def _young_note(clock: Clock, oldest: tuple[float, int, str]) -> str:
    """Why what is in flight is not a hang: its age against the job's pace (``oldest``: the oldest
    young wait's age, rank and call)."""
    age, rank, what = oldest
    when = "when dumped" if clock.at_work_ns is None else "or more (no dump time)"
    return (f"{len(clock.young)} wait(s) in flight, none older than normal: the oldest, rank {rank}'s {what}, "
            f"{age:.2f} s {when}; {clock.pace.describe()}; a stall needs {clock.threshold_s():.2f} s")


def _step_or(step: int | None, otherwise: int | None) -> int | None:
    return step if step is not None else otherwise


def _placed(job: Job, culprits: list[Culprit], stop: StopOrder | None, steps: dict[int, int]) -> list[Culprit]:
    """Each culprit with its host, step and stop time; first to stop first when that is known. A collective
    no step map here places keeps the step the live incident placed it in (its incident.json)."""
    live = recorded_collective_steps(job)
    out = [
        replace(
            c,
            host=job.hosts.get(c.rank),
            step=steps.get(c.rank),
            collective_step=(_step_or(step_of_collective(job, c.group_name, c.collective_seq_id), live.get(c.rank))
                             if steps and c.collective_seq_id is not None and c.peer is None else None),
            stopped_ns=stop.stopped_ns.get(c.rank) if stop else None,
            stopped_after_s=stop.delay_s(c.rank) if stop else None,
        )
        for c in culprits
    ]
    if stop is not None and stop.ordered:
        position = {r: i for i, r in enumerate(stop.ranks)}
        out.sort(key=lambda c: position.get(c.rank, len(position)))
    return out


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _stalled(state: GroupState, clock: Clock) -> bool:
    """A collective in flight long enough to be a stall (in groups with send/recv, as their entries
    show it: never their counters); of unknown age, in flight is enough."""
    f = state.in_flight
    if f is None:
        return False
    if not f.entered:
        return True
    return clock.past(clock.age_s(f.since_ns, f.entered[0], clock.earliest(f.entered)), f.timeout_ms)


def _reference_time(job: Job) -> tuple[int | None, str]:
    """The moment ages are measured to. Dumps carry no timestamp of their own: a file
    written within a day after the last recorded activity dates it (fresh dumps);
    otherwise (copied files) fall back to the newest recorded activity."""
    latest = job.latest_ns
    if not latest:
        return None, "none"
    written = [d.file_mtime_ns for d in job.dumps.values() if d.file_mtime_ns]
    if written and 0 <= min(written) - latest <= DAY_NS:
        return min(written), "dump_files"
    return latest, "latest_activity"


# ---------------------------------------------------------------------------
# Per-group progress and in-flight collective


def _group_state(job: Job, pg: ProcessGroup) -> GroupState:
    progress = {r: job.progress(r, pg.name) for r in pg.ranks}
    state = GroupState(group=pg, progress=progress)
    if pg.has_p2p:
        state.note = (
            f"group {pg.label} carries send/recv: its progress counters mix p2p and collective "
            "sequence numbers, so it is not compared across ranks"
        )
    known = {r: p for r, p in progress.items() if p is not None}
    pending = [p.completed + 1 for p in known.values() if p.completed < p.enqueued]
    if not pending:
        return state
    seq = min(pending)
    entered = tuple(sorted(r for r, p in known.items() if p.enqueued >= seq and p.completed < seq))
    # Never assert the state of a rank whose dump is absent (or silent on this group).
    not_entered = tuple(sorted(r for r, p in known.items() if p.enqueued < seq))
    unknown = tuple(sorted(r for r in pg.ranks if progress[r] is None))
    found = [e for r in entered for e in job.entries_at(r, pg.name, seq)]
    state.in_flight = InFlight(
        seq=seq,
        op=found[0].op if found else None,
        since_ns=min((e.time_created_ns for e in found), default=None),
        entered=entered,
        not_entered=not_entered,
        timeout_ms=found[0].timeout_ms if found else None,
        unknown=unknown,
    )
    return state
