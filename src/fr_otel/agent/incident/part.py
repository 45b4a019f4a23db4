"""One rank's part in an incident: its recorder written beside the others', a copy sent to the coordinator.

Every rank: pull its recorder (torch's full pickle), write it as
``<dump dir>/<trace id>/fr_trace_rank_<global rank>`` (the bytes torch returns, the name
NCCL's automatic dumps use, so ``fr-otel analyze`` reads the folder as is), and send the
coordinator a trimmed copy with true membership: through its node's leader (:mod:`.relay`) or the
store. The raiser then coordinates (:mod:`.conclude`); every other rank waits, bounded, for the verdict,
and a node's first rank fetches the incident's files for its node (:mod:`.files`). Everything is bounded
by a deadline.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from ...common.files import atomic_write, own_folder
from ...common.ids import trace_hex_for
from ...common.log import logger
from ...common.text import one_line
from ...diagnosis.restart import Action
from ...incident.trigger import Trigger
from ...read.failed import FailedCollective
from ..guest.failure import failed_in_recorder
from ..guest.stack_capture import capture_stacks
from ..guest.process_identity import local_world_size
from ..guest.step_counter import COUNTER
from ..links.store_link import StoreUnavailable
from ..serve.health import run_guarded
from ..observe.payload import encode_payload, entries_per_group
from ..observe.proc_state import is_rank_process, sample_processes
from ...read.rank_facts import ProcessFacts
from .conclude import CONCLUDE_RESERVE_S, coordinate
from .files import fetch_files_later, publish_files
from .gather import read_heartbeats
from .local import take_part_locally
from .rank import IncidentRank, dump_path, incident_budget_s
from .relay import send_summary, wait_until_sent

__all__ = ["Ended", "FINAL_ENTRIES", "LEADER_WAIT_POLLS", "await_verdict", "flush_incident", "own_part",
           "publish_final", "send_part", "take_part"]


log = logger("fr_otel.agent")


def own_part(me: IncidentRank, trace_hex: str, failed: tuple[FailedCollective, ...]) -> tuple[bytes, bool]:
    """Write this rank's recorder into the incident's folder (torch's bytes, untouched) and make the
    trimmed copy its coordinator reads (with its stacks now, steps and failed collectives);
    returns the copy and whether the file was written."""
    now = None
    with me.health.guard("capturing the threads' stacks"):
        now = capture_stacks()  # first: where the training thread is at the incident, not after the read
    # The host's ranks are read meanwhile, on a thread of their own: their CPU sample is a sleep, and a part
    # that waits for it reaches its coordinator that much later (a late part reads as a missing rank).
    host_view: dict[int, ProcessFacts] = {}
    until = min(time.monotonic() + HOST_READ_WAIT_S, me.channel.link.current_deadline() or float("inf"))

    def read() -> None:
        with me.channel.link.deadline(until):  # its one store call: within the wait and the exit budget
            host_view.update(read_host_ranks(me))
    reader = threading.Thread(target=run_guarded, name="fr-otel-host-read", daemon=True, args=(
        me.health, "reading its host's ranks in /proc", read))
    reader.start()
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
    leaving = me.leaving.record
    if not failed:  # the exception hook may not have marked them yet: the recorder already shows them done
        with me.health.guard("reading which collectives the failure ended"):
            failed = failed_in_recorder(raw, leaving)
    reader.join(HOST_READ_WAIT_S)
    return encode_payload(raw, me.groups(), keep, dumped_at, me.process, steps=COUNTER.log(), now=now,
                          failed=failed, host_view=dict(host_view), leaving=leaving), written


#: How long a part waits for its host's read (the CPU sample, py-spy's reads by the host's lowest rank) once its
#: recorder is written: past it, the part goes without (a line in the debug log). The read's one store round trip
#: (the node's ranks, when unknown) ends within as long from the read's start.
HOST_READ_WAIT_S = 2.0


def _learn_node_ranks(me: IncidentRank) -> None:
    """Where this node's other ranks run, when this rank does not know yet (only node leaders gather the host map,
    every few seconds: a rank that dies early is not in it): one bounded store round trip for the node's ranks
    (torchrun numbers a node's ranks contiguously), a log line if the store does not answer."""
    local, mine = local_world_size(os.environ), me.process.local_rank
    if not local or mine is None or not 0 <= mine < local or local > MAX_HOST_RANKS:
        return
    first = me.rank - mine
    wanted = [r for r in range(first, first + local) if r not in me.hosts.processes]
    if wanted:
        me.hosts.from_disk()  # the node leader's ranks.json, when it wrote one: no store call
        wanted = [r for r in wanted if r not in me.hosts.processes]
    if wanted:
        with suppress(StoreUnavailable):
            me.hosts.gather(wanted)


#: Ranks of one host read in one sample: a host runs a handful (a simulated one, more).
MAX_HOST_RANKS = 64


def read_host_ranks(me: IncidentRank) -> dict[int, ProcessFacts]:
    """What ``/proc`` shows of this host's ranks (this one included): a sibling speaks for a rank that cannot
    (stopped, its GIL held, gone). The lowest rank of the host also reads their Python stacks from outside
    (py-spy, non-blocking), where installed."""
    host = me.process.host
    _learn_node_ranks(me)
    pids = {r: p.pid for r, p in me.hosts.processes.items() if p.host == host and p.pid is not None and host}
    if me.process.pid is not None:
        pids[me.rank] = me.process.pid
    pids = {r: pid for r, pid in sorted(pids.items())[:MAX_HOST_RANKS] if is_rank_process(pid, r)}
    outside = frozenset(pids) if pids and min(pids) == me.rank else frozenset()
    return sample_processes(pids, me.rank, me.oom_baseline, outside_for=outside)


#: What an incident's end leaves a rank: the verdict's summary as it knows it (:func:`fr_otel.incident.summary.brief_summary`;
#: None when it never learnt it) and the threads still writing this node's copy of the incident's files.
Ended = tuple[dict[str, Any] | None, tuple[threading.Thread, ...]]


def take_part(me: IncidentRank, trigger: Trigger, owner: bool, local: bool, deadline: float,
              failed: tuple[FailedCollective, ...], preempted: Callable[[], bool] | None = None) -> Ended:
    """This rank's part in the incident: through the store while it answers; when it fails during the
    incident (its host went with the fault), this node's part without it, same number (:mod:`.local`).
    ``failed``: the collectives a failure ended here; ``preempted``: see :func:`flush_incident`."""
    k = trigger.number
    trace_hex = trace_hex_for(me.job_id, str(k))
    me.channel.forget_heard()  # a local verdict says only what was heard during this incident
    if owner and not local:  # while the store answers: when every rank was last heard, for a local verdict
        with me.health.guard("reading the heartbeats"), suppress(StoreUnavailable):
            read_heartbeats(me)  # node leaders' heartbeats too
    part = own_part(me, trace_hex, failed)
    me.health.incident(trace_hex)
    if not local:
        try:
            return flush_incident(me, trigger, trace_hex, owner, deadline, part, preempted=preempted)
        except StoreUnavailable as exc:
            log.warning("incident %d: the job's store went away during it (%s); this node reports its own part",
                        k, one_line(exc, 200))
            if me.node is not None:
                with me.health.guard("telling this node's ranks"):
                    me.node.ended_as(k, verdict=False)  # a leader's ranks go on without the store too
    return take_part_locally(me, trigger, deadline, part), ()


def flush_incident(me: IncidentRank, trigger: Trigger, trace_hex: str, owner: bool, deadline: float,
                   part: tuple[bytes, bool], preempted: Callable[[], bool] | None = None) -> Ended:
    """This rank's part in the incident through the store (``part``: :func:`own_part`'s); the
    coordinator's too when ``owner``. Raises :class:`~..links.store_link.StoreUnavailable` when the store fails before
    the verdict: the caller then reports this node's part without it (:mod:`.local`). A member
    stops waiting for the verdict once ``preempted()`` says other incident work waits. Returns the verdict's
    summary as this rank knows it (None: not known here) and this node's file fetch, if one runs."""
    k = trigger.number
    payload, written = part
    try:
        send_part(me, k, payload, deadline)
    except StoreUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - the store refused this one call: the coordinator goes on
        me.health.error("sending the recorder to the incident's coordinator", exc)
    folder = dump_path(me, trace_hex).parent
    if owner:
        gathered, result = coordinate(me, trigger, trace_hex, deadline, dump_written=written)
        with me.health.guard("publishing the verdict"):
            me.channel.set_result(k, result)
            if not gathered.asked:
                me.channel.ask(k, "")  # node leaders stop waiting for a request
            publish_files(me, k, folder)
            me.channel.cleanup(k, gathered.flat_ranks, gathered.summaries)
        if me.node is not None:
            me.node.ended_as(k, verdict=True, hang=result.get("hang") is True,
                             code_fault=result.get("action") == Action.FIX_CODE)
        return result, ()
    fetch = fetch_files_later(me, k, folder, incident_budget_s(me) + 5) if me.hosts.leader else None
    return await_verdict(me, k, deadline, preempted), (fetch,) if fetch is not None else ()


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
            if role is None or not role.leader_saw_hang(k):
                return {}
            fix = role.leader_saw_code_fault(k)
            return {"verdict": "hang", "hang": True, "action": Action.FIX_CODE if fix else None}
        result = me.channel.result(k) if word == "ask the store" else None
        if result is not None:
            if role is not None:
                role.ended_as(k, verdict=True, hang=result.get("hang") is True,
                              code_fault=result.get("action") == Action.FIX_CODE)
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


#: Entries per group in a rank's exit copy: every rank leaves one, so it stays small (~KBs).
FINAL_ENTRIES = 8


def publish_final(me: IncidentRank, failed: tuple[FailedCollective, ...] = ()) -> None:
    """At exit: leave this rank's recorder in the store for a later incident's coordinator
    (a rank that finished early is exactly the one its peers will wait for)."""
    raw = me.read_recorder()
    keep = min(me.config.incident_entries, FINAL_ENTRIES)
    leaving = me.leaving.record
    me.channel.publish_final(me.rank, encode_payload(raw, me.groups(), keep, time.time_ns(), me.process,
                                                     COUNTER.log(), failed=failed or failed_in_recorder(raw, leaving),
                                                     leaving=leaving))
