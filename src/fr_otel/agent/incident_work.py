"""One rank's part in an incident, and the raiser's extra part: the verdict and the trace.

Every rank: pull its recorder (torch's full pickle), write it as
``<dump dir>/<trace id>/fr_trace_rank_<global rank>`` (the bytes torch returns, the name
NCCL's automatic dumps use, so ``fr-otel analyze`` reads the folder as is), and send the
raiser a trimmed copy with true membership through the store.

The raiser (the coordinator): wait, bounded, until every rank sent its copy (ranks that
exited earlier left one at exit), build the job, analyse it once, and export one trace:
the verdict as root, each rank's spans under its own resource, one span per collective
that every rank's entry links to. One process builds and exports every span, so each
arrives exactly once and every link resolves; a collector that is down leaves a spool
file (``fr-otel replay``). Everything is bounded by a deadline.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..common.files import atomic_write, own_folder
from ..common.ranks import compress_ranks
from ..diagnosis.step_map import steps_file_json
from ..incident.delivery import out_dir
from ..incident.files import write_incident_files
from ..otlp.config import ExportConfig
from ..read.live_stack import capture_stacks
from ..read.rank_map import RANKS_FILE, rank_map_json
from ..read.rank_process import RankProcess
from ..read.reader import ReadResult
from ..read.steps import COUNTER, STEPS_FILE
from ..trace.ids import trace_id_for
from .channel import IncidentChannel
from .config import AgentConfig
from .health import HealthTracker
from .payload import decode_payload, encode_payload, entries_per_group
from .recorder import GroupInfo

if TYPE_CHECKING:
    from ..diagnosis.verdict import Culprit

__all__ = ["DUMP_FILE_PREFIX", "FINAL_ENTRIES", "IncidentRank", "coordinate", "dump_path", "dump_root",
           "flush_incident", "publish_final"]

DUMP_FILE_PREFIX = "fr_trace_rank_"
_GATHER_POLL_S = 0.05

log = logging.getLogger("fr_otel.agent")


@dataclass(frozen=True, slots=True)
class IncidentRank:
    """What an incident needs of this rank, and nothing more: known once the process group exists."""

    config: AgentConfig
    export_config: ExportConfig
    health: HealthTracker
    channel: IncidentChannel
    job_id: str
    rank: int
    world_size: int
    #: Where this rank runs (host, pid, local rank), for the coordinator's job model.
    process: RankProcess
    #: This rank's recorder as torch's full pickle, stacks included.
    read_recorder: Callable[[], bytes]
    #: The process groups Python knows now (true membership; gloo's ``pg_config`` is empty).
    groups: Callable[[], tuple[GroupInfo, ...]]


def dump_root(config: AgentConfig) -> Path:
    """The folder incident dumps go to: ``dump_dir``, else ``<out dir>/dumps``."""
    return Path(config.dump_dir) if config.dump_dir else out_dir(config.out_dir) / "dumps"


def dump_path(me: IncidentRank, trace_hex: str) -> Path:
    return dump_root(me.config) / trace_hex / f"{DUMP_FILE_PREFIX}{me.rank}"


def flush_incident(me: IncidentRank, k: int, meta: dict[str, Any], owner: bool, deadline: float) -> None:
    """This rank's part in incident ``k``; the coordinator's too when ``owner``."""
    trace_hex = f"{trace_id_for(me.job_id, str(k)):032x}"
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
        log.debug("incident %d: recorder written to %s", k, path)
    with me.health.guard("sending the recorder to the incident's coordinator"):
        keep = entries_per_group(me.config.incident_entries, me.world_size)
        me.channel.publish(k, me.rank, encode_payload(raw, me.groups(), keep, dumped_at, me.process,
                                                      steps=COUNTER.log(), now=now))
    me.health.incident(trace_hex)
    if owner:
        coordinate(me, k, meta, trace_hex, deadline, dump_written=written)


def coordinate(me: IncidentRank, k: int, meta: dict[str, Any], trace_hex: str, deadline: float, *,
               dump_written: bool = True) -> None:
    """Gather every rank's recorder (bounded), analyse once, export the incident's trace."""
    from ..diagnosis.analysis import (
        analyze,  # the export stack loads only when an incident happens
    )
    from ..diagnosis.job import build_job
    from ..incident.delivery import deliver_trace
    from ..trace.spans import TraceOptions, build_trace

    world = me.world_size
    gather_until = min(time.monotonic() + me.config.gather_seconds, deadline)
    while me.channel.arrived(k) < world and time.monotonic() < gather_until:
        time.sleep(_GATHER_POLL_S)
    ranks = list(range(world))
    payloads = me.channel.fetch(k, ranks)
    late = [r for r in ranks if r not in payloads]
    finals = me.channel.fetch_final(late) if late else {}
    problems: list[str] = []
    read = ReadResult(problems=problems)
    for rank, payload in sorted({**finals, **payloads}.items()):
        source = f"rank {rank} ({'at its exit' if rank in finals and rank not in payloads else 'live'})"
        dump = decode_payload(payload, rank, source, problems)
        if dump is not None:
            read.dumps[rank] = dump
    if late:
        gone = [r for r in late if r not in finals]
        if gone:
            problems.append(f"rank(s) {compress_ranks(gone)} sent no recorder within {me.config.gather_seconds:g} s "
                            "(stuck with the GIL held, or dead)")
    job = build_job(read)
    verdict = analyze(job)
    folder = dump_path(me, trace_hex).parent
    beside = False  # files beside the dumps: only into a folder that is really ours
    with me.health.guard("writing ranks.json and steps.json beside the dumps"):
        own_folder(folder)
        beside = True
        # Dump files say neither where a rank ran nor its training step: these let a later
        # `fr-otel analyze` of the folder say both.
        atomic_write(folder / RANKS_FILE, json.dumps(rank_map_json(job.processes)).encode())
        if any(d.steps is not None for d in job.dumps.values()):
            atomic_write(folder / STEPS_FILE, json.dumps(steps_file_json(job)).encode())
    root = [
        ("fr_otel.incident.number", k),
        ("fr_otel.incident.reason", str(meta.get("reason", ""))),
        ("fr_otel.incident.raised_by", int(meta.get("rank", me.rank))),
    ]
    for key in ("pg_name", "seq", "op", "age_s", "threshold_s"):
        if key in meta:
            root.append((f"fr_otel.incident.detected.{key}", meta[key]))
    trace = build_trace(job, verdict, TraceOptions(job_id=me.job_id, incident=str(k), root_attributes=tuple(root)))
    remaining = max(deadline - time.monotonic(), 1.0)
    outcome = deliver_trace(trace, me.export_config, directory=me.config.out_dir,
                            deadline_s=min(remaining, me.export_config.timeout_s))
    if not outcome.ok:
        me.health.export_failed()
    culprits = ", ".join(_brief(c) for c in verdict.culprits[:8]) or "none named"
    if verdict.stop_order is not None and verdict.stop_order.sentence():
        culprits += f" ({verdict.stop_order.sentence()})"
    where = outcome.describe(len(trace.spans), me.export_config)
    if beside:
        with me.health.guard("writing incident.json and incident.html beside the dumps"):
            write_incident_files(folder, job, verdict, trace, outcome, me.export_config)
    dumps = f"dumps and report in {folder}" if dump_written else f"no dump files: {folder} could not be written"
    log.warning("incident %d (%s, raised by rank %s): %s; culprits: %s; %d of %d ranks' recorders; trace %s %s; %s",
                k, meta.get("reason", "?"), meta.get("rank", "?"), verdict.verdict, culprits,
                len(read.dumps), world, trace_hex, where, dumps)
    with me.health.guard("publishing the verdict"):
        me.channel.set_result(k, {"verdict": verdict.verdict, "trace_id": trace_hex,
                                  "culprits": [c.rank for c in verdict.culprits], "export": outcome.status,
                                  "spans_rejected": outcome.result.spans_rejected if outcome.result else 0})
        me.channel.cleanup(k, list(payloads))


def _brief(c: Culprit) -> str:
    """``rank 2 (not_enqueued, host vm, step 20) at vm:4242 in time.sleep at train.py:27 in main``."""
    parts = [c.kind] + ([f"host {c.host}"] if c.host else []) + ([f"step {c.step}"] if c.step is not None else [])
    text = f"rank {c.rank} ({', '.join(parts)})"
    if c.process is not None and c.process.known:
        text += f" at {c.process.address}"
    if c.now is not None and c.now.where is not None:
        text += f" {c.now.describe()}"
    return text


#: Entries per group in a rank's exit copy: every rank leaves one, so it stays small (~KBs).
FINAL_ENTRIES = 8


def publish_final(me: IncidentRank) -> None:
    """At exit: leave this rank's recorder in the store for a later incident's coordinator
    (a rank that finished early is exactly the one its peers will wait for)."""
    raw = me.read_recorder()
    keep = min(me.config.incident_entries, FINAL_ENTRIES)
    me.channel.publish_final(me.rank, encode_payload(raw, me.groups(), keep, time.time_ns(), me.process,
                                                     COUNTER.log()))
