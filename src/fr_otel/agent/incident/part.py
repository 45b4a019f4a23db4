"""One rank's part in an incident, and the raiser's extra part: the verdict and the trace.

Every rank: pull its recorder (torch's full pickle), write it as
``<dump dir>/<trace id>/fr_trace_rank_<global rank>`` (the bytes torch returns, the name
NCCL's automatic dumps use, so ``fr-otel analyze`` reads the folder as is), and send the
raiser a trimmed copy with true membership through the store.

The raiser (the coordinator): wait, bounded, until every rank sent its copy (ranks that
exited earlier left one at exit), then hand them to the incident pipeline
(:mod:`fr_otel.incident.pipeline`) for one verdict and one trace: the verdict as root, each
rank's spans under its own resource, one span per collective that every rank's entry links
to. One process builds and exports every span, so each arrives exactly once and every link
resolves; a collector that is down leaves a spool file (``fr-otel replay``). Everything is
bounded by a deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ...common.files import atomic_write, own_folder
from ...common.ids import trace_id_for
from ...common.log import logger
from ...common.ranks import compress_ranks
from ...common.text import one_line
from ...incident.sinks import sink_for
from ...read.failed import FailedCollective
from ...read.incident_file import DETECTED_KEYS, DETECTED_PREFIX, REASON_ATTRIBUTE
from ...read.reader import ReadResult
from ...trace.options import TraceOptions
from .rank import IncidentRank, dump_path
from .files import fetch_files_later, publish_files
from ..links.node_leader import send_summary, wait_until_sent
from ..observe.payload import encode_payload, entries_per_group
from ...common.gc_pause import gc_paused
from ..guest.stack_capture import capture_stacks
from ..guest.step_counter import COUNTER
from .gather import Gathered, complete_from_nodes, gather
from ..links.store_link import StoreUnavailable

if TYPE_CHECKING:
    from ...diagnosis.verdict import Culprit

__all__ = ["CONCLUDE_RESERVE_S", "COORDINATOR_S_PER_RANK", "Ended", "incident_budget_s", "FINAL_ENTRIES", "LEADER_WAIT_POLLS", "await_verdict", "conclude", "coordinate",
           "flush_incident", "own_part", "publish_final", "send_part"]


log = logger("fr_otel.agent")


def own_part(me: IncidentRank, trace_hex: str, failed: tuple[FailedCollective, ...]) -> tuple[bytes, bool]:
    """Write this rank's recorder into the incident's folder (torch's bytes, untouched) and make the
    trimmed copy its coordinator reads (with its stacks now, steps and failed collectives);
    returns the copy and whether the file was written."""
    now = None
    with me.health.guard("capturing the threads' stacks"):
        now = capture_stacks()  # first: where the training thread is at the incident, not after the read
    raw = me.read_recorder()
    dumped_at = time.time_ns()
    path = dump_path(me, trace_hex)
    written = False
    with me.health.guard("writing the dump file"):
        own_folder(path.parent)  # a planted <trace id> link is refused, never written into
        atomic_write(path, raw)  # a planted link at the file's name is replaced, never written through
        written = True
        log.debug("incident %s: recorder written to %s", trace_hex, path)
    keep = entries_per_group(me.config.incident_entries, me.world_size)
    return encode_payload(raw, me.groups(), keep, dumped_at, me.process, steps=COUNTER.log(), now=now,
                          failed=failed), written


#: What an incident's end leaves a rank: the verdict's summary as it knows it (the store's result shape;
#: None when it never learnt it) and the threads still writing this node's copy of the incident's files.
Ended = tuple[dict[str, Any] | None, tuple[threading.Thread, ...]]


def flush_incident(me: IncidentRank, k: int, meta: dict[str, Any], owner: bool, deadline: float,
                   part: tuple[bytes, bool], preempted: Callable[[], bool] | None = None) -> Ended:
    """This rank's part in incident ``k`` through the store (``part``: :func:`own_part`'s); the
    coordinator's too when ``owner``. Raises :class:`~..links.store_link.StoreUnavailable` when the store fails before
    the verdict: the caller then reports this node's part without it (:mod:`.local`). A member
    stops waiting for the verdict once ``preempted()`` says other incident work waits. Returns the verdict's
    summary as this rank knows it (None: not known here) and this node's file fetch, if one runs."""
    trace_hex = f"{trace_id_for(me.job_id, str(k)):032x}"
    payload, written = part
    try:
        send_part(me, k, payload, deadline)
    except StoreUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - the store refused this one call: the coordinator goes on
        me.health.error("sending the recorder to the incident's coordinator", exc)
    folder = dump_path(me, trace_hex).parent
    if owner:
        gathered, result = coordinate(me, k, meta, trace_hex, deadline, dump_written=written)
        with me.health.guard("publishing the verdict"):
            me.channel.set_result(k, result)
            if not gathered.asked:
                me.channel.ask(k, "")  # node leaders stop waiting for a request
            publish_files(me, k, folder)
            me.channel.cleanup(k, gathered.flat_ranks, gathered.summaries)
        if me.node is not None:
            me.node.ended_as(k, verdict=True, hang=result.get("hang") is True)
        return result, ()
    fetch = fetch_files_later(me, k, folder, incident_budget_s(me) + 5) if me.hosts.leader else None
    return await_verdict(me, k, deadline, preempted), (fetch,) if fetch is not None else ()


def coordinate(me: IncidentRank, k: int, meta: dict[str, Any], trace_hex: str, deadline: float, *,
               dump_written: bool = True) -> tuple[Gathered, dict[str, Any]]:
    """The coordinator's gathering and verdict for incident ``k`` (returns what was gathered and the
    verdict's summary), with the cyclic GC paused throughout: at 16k ranks it rescans the growing heap
    of decoded recorders again and again (40 % of the decoding's CPU, a third of the analysis'). The
    pause is bounded by the incident's deadline, and only cyclic garbage waits for it (reference
    counting frees the rest)."""
    slow = meta.get("slow_ranks")
    expected = [r for r in slow if isinstance(r, int)] if isinstance(slow, list) else []
    with gc_paused():
        gathered = gather(me, k, deadline, expected)
        result = conclude(me, k, meta, gathered.evidence, trace_hex, deadline, dump_written=dump_written,
                          complete=partial(complete_from_nodes, me, k, gathered, deadline))
    return gathered, result


#: What a local verdict needs after the store is found gone: its own node's gathering and the pipeline.
CONCLUDE_RESERVE_S = 3.0
#: The coordinator's own work per rank of the job (decoding, the job model, the analysis: 0.31-0.35 ms
#: on a core of its own from 16k to 100k ranks, bench/README.md), with room for a busy host.
COORDINATOR_S_PER_RANK = 0.001


def incident_budget_s(me: IncidentRank) -> float:
    """How long one incident's work may take (the gathering, the coordinator's own work, the export, a
    margin): the bound every rank of it holds its store calls and its wait for the verdict to. It grows with
    the job: a fixed 30 s cut a 100k-rank coordinator off mid-analysis (its work alone is ~35 s there), so
    its verdict, files and whole-recorder request never reached the store."""
    return me.config.gather_seconds + me.world_size * COORDINATOR_S_PER_RANK + me.export_config.timeout_s + 5


def await_verdict(me: IncidentRank, k: int, deadline: float,
                  preempted: Callable[[], bool] | None = None) -> dict[str, Any] | None:
    """Wait (one ``check`` per poll interval, until :data:`CONCLUDE_RESERVE_S` before ``deadline``) for
    the coordinator's verdict. Why wait: a rank still in the incident keeps its node, and the store
    its node may run, alive until the verdict exists (a rank of the store's node that exits at once
    takes the store with it), and it is how a rank learns the store went away mid-incident (the
    call raises :class:`~..links.store_link.StoreUnavailable`) while its node can still report its own part.
    A member whose node leader answers waits on its board instead (no store call: a node counts once in
    the store): the leader says when it saw the verdict, or that the store went away. It stops waiting
    when ``preempted()`` (another incident's work is queued: its part here is sent, and an incident whose
    verdict never comes, forged or its raiser gone, must not hold the next one up for its whole budget).
    Returns the verdict's summary (through a board: only whether it calls for a restart), None if none came."""
    until = deadline - CONCLUDE_RESERVE_S
    role = me.node
    while time.monotonic() < until and not (preempted is not None and preempted()):
        word = role.verdict_word(k) if role is not None else "ask the store"
        if word == "lost":
            raise StoreUnavailable("this node's leader found the job's store gone during the incident")
        if word == "verdict":
            return {"verdict": "hang", "hang": True} if role is not None and role.leader_saw_hang(k) else {}
        result = me.channel.result(k) if word == "ask the store" else None
        if result is not None:
            if role is not None:
                role.ended_as(k, verdict=True, hang=result.get("hang") is True)
            return result
        time.sleep(min(me.config.poll_interval, max(until - time.monotonic(), 0.0)))
    return None


def send_part(me: IncidentRank, k: int, payload: bytes, deadline: float) -> None:
    """This rank's payload to the coordinator: through its node's leader while one carries it (the leader
    sends the node's summary), else through the store; a rank its leader left out sends its own."""
    role = me.node
    if role is None or not (role.leader or role.relayed()):
        me.channel.publish(k, me.rank, payload)
        return
    try:
        role.node.drop_payload(k, payload)
    except OSError as exc:  # the node's folder full, gone or planted: the store still takes the recorder
        log.warning("incident %d: rank %d cannot leave its recorder in its node's folder (%s); it sends it "
                    "through the store", k, me.rank, exc.strerror or exc)
        me.channel.publish(k, me.rank, payload)
        return
    wait = min(deadline, time.monotonic() + LEADER_WAIT_POLLS * me.config.poll_interval + 2.0)
    if role.leader:
        try:
            send_summary(role, k, wait, deadline)
        except StoreUnavailable:
            raise  # the store itself is gone: the lost-store path, not a second bounded wait on it
        except Exception as exc:  # noqa: BLE001 - its ranks time out on the board and send their own too
            log.warning("incident %d: this node's summary failed (%s); rank %d sends its own recorder through "
                        "the store", k, one_line(exc), me.rank)
            me.channel.publish(k, me.rank, payload)
    elif not wait_until_sent(role, k, wait + me.config.poll_interval):
        log.info("incident %d: this node's leader did not send rank %d's recorder; it sends its own", k, me.rank)
        me.channel.publish(k, me.rank, payload)


#: How many polls a node leader waits for its ranks' payloads (they see the incident on the next one).
LEADER_WAIT_POLLS = 2


def conclude(me: IncidentRank, k: int, meta: dict[str, Any], evidence: ReadResult, trace_hex: str, deadline: float,
             *, dump_written: bool = True, local: bool = False,
             complete: Callable[..., bool] | None = None) -> dict[str, Any]:
    """The incident pipeline over the gathered evidence: verdict, trace, files beside the dumps, one
    log line; returns the verdict's summary (what the store's result key holds)."""
    # The analysis loads only when an incident happens.
    from ...diagnosis.hosts import LOST_STATES
    from ...diagnosis.restart import calls_for_restart, hosts_to_exclude
    from ...incident.pipeline import IncidentPlan, run_incident

    root = [
        ("fr_otel.incident.number", k),
        (REASON_ATTRIBUTE, str(meta.get("reason", ""))),
        ("fr_otel.incident.raised_by", int(meta.get("rank", me.rank))),
    ]
    if local:
        root.append(("fr_otel.incident.local_to", me.process.host or ""))
    root.extend((DETECTED_PREFIX + key, meta[key]) for key in DETECTED_KEYS if key in meta)
    folder = dump_path(me, trace_hex).parent
    mine = False  # files beside the dumps: only into a folder that is really ours
    with me.health.guard("checking the incident's folder"):
        own_folder(folder)
        mine = True
    remaining = max(deadline - time.monotonic(), 1.0)
    options = TraceOptions(job_id=me.job_id, incident=str(k), root_attributes=tuple(root),
                           root_key=f"local/{me.process.host}" if local else "")
    plan = IncidentPlan(trace=options, sink=sink_for(me.export_config, me.config.out_dir),
                        files_to=folder if mine else None, deadline_s=min(remaining, me.export_config.timeout_s),
                        complete=partial(complete, options=options) if complete is not None else None)
    result = run_incident(evidence, plan)
    trace, outcome, verdict = result.trace, result.outcome, result.verdict
    assert trace is not None and outcome is not None
    if not outcome.ok:
        me.health.export_failed()
    if result.files_error:
        log.warning("incident %d: %s", k, result.files_error)
    culprits = ", ".join(_brief(c) for c in verdict.culprits[:8]) or "none named"
    gone = [h.sentence() for h in verdict.hosts if h.state in LOST_STATES]
    if gone:
        culprits = f"{'; '.join(gone[:4])}; {culprits}"
    if verdict.stop_order is not None and verdict.stop_order.sentence():
        culprits += f" ({verdict.stop_order.sentence()})"
    away = [f"{h.host} (ranks {compress_ranks(h.missing)})" for h in verdict.hosts if h.state == "unreachable"]
    if away:
        culprits += f"; unreachable from here, not culprits: {', '.join(away[:6])}"
    exclude = hosts_to_exclude(verdict)
    if exclude:
        me.health.exclude(k, exclude)
        culprits += f"; leave out next time: {', '.join(exclude[:8])} (exclude-hosts.txt)"
    where = outcome.describe(len(trace.spans), me.export_config)
    dumps = f"dumps and report in {folder}" if dump_written else f"no dump files: {folder} could not be written"
    scope = f"local to {me.process.host}, " if local else ""
    log.warning("incident %d (%s%s, raised by rank %s): %s; culprits: %s; %d of %d ranks' recorders; trace %s %s; %s",
                k, scope, meta.get("reason", "?"), meta.get("rank", "?"), verdict.verdict, culprits,
                len(evidence.dumps), me.world_size, trace_hex, where, dumps)
    return {"verdict": str(verdict.verdict), "trace_id": trace_hex, "culprits": [c.rank for c in verdict.blamed],
            "export": str(outcome.status), "spans_rejected": outcome.result.spans_rejected if outcome.result else 0,
            "hang": calls_for_restart(verdict), "exclude_hosts": list(exclude)}


def _brief(c: Culprit) -> str:
    """``rank 2 (not_enqueued, host vm, step 20) at vm:4242 in time.sleep at train.py:27 in main``; a rank
    that counted no step of its own (no dump: lost, frozen) gets the step of the collective it is blamed in."""
    step = c.step if c.step is not None else c.collective_step
    parts = [c.kind] + ([f"host {c.host}"] if c.host else []) + ([f"step {step}"] if step is not None else [])
    text = f"rank {c.rank} ({', '.join(parts)})"
    if c.process is not None and c.process.known:
        text += f" at {c.process.address}"
    if c.now is not None and c.now.where is not None:
        text += f" {c.now.describe()}"
    return text


#: Entries per group in a rank's exit copy: every rank leaves one, so it stays small (~KBs).
FINAL_ENTRIES = 8


def publish_final(me: IncidentRank, failed: tuple[FailedCollective, ...] = ()) -> None:
    """At exit: leave this rank's recorder in the store for a later incident's coordinator
    (a rank that finished early is exactly the one its peers will wait for)."""
    raw = me.read_recorder()
    keep = min(me.config.incident_entries, FINAL_ENTRIES)
    me.channel.publish_final(me.rank, encode_payload(raw, me.groups(), keep, time.time_ns(), me.process,
                                                     COUNTER.log(), failed=failed))
