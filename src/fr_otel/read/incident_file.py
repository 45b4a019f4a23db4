"""``incident.json``: one live incident's identity, kept next to its dumps, read back.

The live agent sends a trace whose id is ``trace_id_for(job id, incident number)`` and
leaves the ranks' dumps in a folder. Dump files do not know that job id, nor where each
rank ran or what it was doing at incident time (those travelled in the agent's payloads),
so the incident's writer (:mod:`fr_otel.incident.files`) leaves this file beside the dumps;
reading a folder picks it up (:mod:`fr_otel.read.sidecars`), so an offline analysis names
the same hosts and stacks and an export gives the same trace id.

The file is untrusted input like the dumps: it is read by :mod:`.side_files`, unknown keys are
ignored, ill-typed values dropped, identities checked, and a file that cannot be used costs one
problem line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from ..common.ids import trace_hex_for
from ..common.names import identity_problem, is_trace_id
from .dump import RankDump
from .failed import FailedCollective, failed_from_raw
from .live_stack import LiveStacks, stacks_from_raw
from .network import NetworkFacts, network_from_raw
from .rank_facts import ExitRecord, ProcessFacts, exit_from_raw, facts_from_raw
from .side_files import bounded_attributes, per_rank, read_side_file, side_file_present

__all__ = ["FORMAT", "INCIDENT_FILE", "LIVE_INCIDENT_SOURCE", "ROOT_ATTRIBUTE_PREFIX", "IncidentIdentity",
           "dump_file_sizes", "find_identity", "merge_identities", "read_identity"]

INCIDENT_FILE = "incident.json"
FORMAT = "fr-otel/incident/1"
#: The root attributes an incident file may carry: the agent's own (how it detected the incident).
ROOT_ATTRIBUTE_PREFIX = "fr_otel.incident."


#: The source of a rank's process record (:attr:`RankProcess.source`) that the live incident wrote
#: beside its identity (ranks.json at incident time): the agent saw it then.
LIVE_INCIDENT_SOURCE = "incident file"


@dataclass(slots=True)
class IncidentIdentity:
    """Who the incident is (job id, number, trace id) and what the agent knew per rank at its
    moment (stacks, what failed). Where each rank ran is not here: ``ranks.json`` is its one home."""

    job_id: str
    incident: str
    trace_id: str
    root_attributes: tuple[tuple[str, Any], ...] = ()
    stacks: dict[int, LiveStacks] = field(default_factory=dict)
    failed: dict[int, tuple[FailedCollective, ...]] = field(default_factory=dict)  # what the backend retired as failed
    host: dict[int, ProcessFacts] = field(default_factory=dict)  # what /proc showed of each rank, read by a host-mate
    exits: dict[int, ExitRecord] = field(default_factory=dict)  # how ranks that left said they left
    network: NetworkFacts | None = None  # the store and other hosts, as the coordinating node saw them
    summary: dict[str, Any] = field(default_factory=dict)  # verdict, culprits, export outcome (for people)
    files: dict[str, int] = field(default_factory=dict)  # dump file name -> size it had (empty: not checked)
    path: str = ""
    #: Every node's view of the network, when several nodes' files of this incident were read together.
    views: tuple[NetworkFacts, ...] = ()
    #: The incident files read into this one (one per node folder).
    sources: tuple[str, ...] = ()

    def stale_for(self, dumps: Mapping[int, RankDump]) -> str | None:
        """Why this identity does not describe these dump files (a newer incident overwrote
        them beside an old incident.json), or None when it does or cannot tell."""
        if not self.files:
            return None
        # A listed file absent is another node's (or not copied); a file not listed is another node's:
        # only a listed file of another size was overwritten.
        now = dump_file_sizes(dumps)
        changed = sorted(n for n in set(now) & set(self.files) if now[n] != self.files[n])
        return f"the dump files changed since it was written ({', '.join(changed[:3])})" if changed else None

    def to_json(self) -> dict[str, Any]:
        ranks: dict[str, dict[str, Any]] = {}
        for rank in sorted(set(self.stacks) | set(self.failed) | set(self.host) | set(self.exits)):
            doc: dict[str, Any] = {}
            if rank in self.stacks:
                doc["now"] = self.stacks[rank].as_json()
            if self.failed.get(rank):
                doc["failed"] = [m.as_json() for m in self.failed[rank]]
            if rank in self.host:
                doc["proc"] = self.host[rank].as_json()
            if rank in self.exits:
                doc["exit"] = self.exits[rank].as_json()
            ranks[str(rank)] = doc
        return {
            "format": FORMAT,
            "job_id": self.job_id,
            "incident": self.incident,
            "trace_id": self.trace_id,
            "root_attributes": [[k, v] for k, v in self.root_attributes],
            "network": self.network.as_json() if self.network is not None else None,
            "summary": self.summary,
            "ranks": ranks,
            "files": self.files,
        }


def find_identity(paths: Sequence[str | os.PathLike[str]], problems: list[str]) -> IncidentIdentity | None:
    """The identity of the dump folders among ``paths`` (a folder, or the folder of its files), if any.

    Every node of a job leaves an ``incident.json`` beside its own dumps: read together, those of one
    incident (one trace id) are one identity (:func:`merge_identities`); files of different incidents
    cost one problem line and none is used, since no trace id fits all the dumps. Anything named
    ``incident.json`` there is read (a FIFO or a looping link costs a problem line, as a dump would),
    so a bad one is said, not skipped in silence."""
    folders = {Path(p) if Path(p).is_dir() else Path(p).parent for p in paths}
    found = [f / INCIDENT_FILE for f in sorted(folders) if side_file_present(str(f / INCIDENT_FILE))]
    identities = [i for i in (read_identity(path, problems) for path in found) if i is not None]
    traces = sorted({i.trace_id for i in identities})
    if len(traces) > 1:
        listed = ", ".join(f"{i.path} (trace {i.trace_id})" for i in identities[1:])
        problems.append(f"{identities[0].path}: several incident files of different incidents among the inputs "
                        f"(trace {identities[0].trace_id}; {listed}); using none")
        return None
    return merge_identities(identities) if identities else None


def merge_identities(identities: Sequence[IncidentIdentity]) -> IncidentIdentity:
    """Several nodes' incident files of one incident as one: the first that holds a verdict speaks for it
    (the coordinator's copy, or a node's own part when the store was lost), every node's stacks, failed
    collectives, dump files and network view are kept."""
    primary = next((i for i in identities if i.summary), identities[0])
    merged = replace(primary, stacks=dict(primary.stacks), failed=dict(primary.failed), files=dict(primary.files),
                     host=dict(primary.host), exits=dict(primary.exits))
    views: dict[str, NetworkFacts] = {}
    for identity in (primary, *identities):
        for rank, now in identity.stacks.items():
            merged.stacks.setdefault(rank, now)
        for rank, marks in identity.failed.items():
            merged.failed.setdefault(rank, marks)
        for rank, facts in identity.host.items():
            merged.host.setdefault(rank, facts)
        for rank, record in identity.exits.items():
            merged.exits.setdefault(rank, record)
        for name, size in identity.files.items():
            merged.files.setdefault(name, size)
        for view in identity.views or ((identity.network,) if identity.network is not None else ()):
            views.setdefault(view.seen_from, view)
    merged.views = tuple(views.values())
    merged.sources = tuple(i.path for i in identities)
    return merged


def read_identity(path: str | os.PathLike[str], problems: list[str]) -> IncidentIdentity | None:
    """Parse one ``incident.json`` through the side-file reader (:mod:`.side_files`); None (and one
    problem line) when unusable. The job id, incident key and trace id must be identities
    (:func:`fr_otel.common.names.identity_problem`) and agree with each other."""
    path = str(path)
    raw = read_side_file(path, problems, "ignored")
    if raw is None:
        return None
    if raw.get("format") != FORMAT:
        problems.append(f"{path}: not an fr-otel incident file (format {FORMAT!r} expected); ignored")
        return None
    job_id, incident, trace_id = raw.get("job_id"), raw.get("incident"), raw.get("trace_id")
    if not (isinstance(job_id, str) and job_id and isinstance(incident, str) and isinstance(trace_id, str)):
        problems.append(f"{path}: incident file without job_id, incident and trace_id strings; ignored")
        return None
    why = identity_problem(job_id, "job_id") or identity_problem(incident, "incident")
    if why is None and not (is_trace_id(trace_id) and trace_id == trace_hex_for(job_id, incident)):
        why = "its trace_id is not the one its job_id and incident give"
    if why is not None:
        problems.append(f"{path}: {why}; ignored")
        return None
    entries = per_rank(path, raw, problems, "stacks from it unknown", _rank_entry)
    root_attributes = bounded_attributes(path, raw.get("root_attributes"), problems, ROOT_ATTRIBUTE_PREFIX)
    summary = raw.get("summary")
    files = raw.get("files")
    files = {k: v for k, v in files.items() if type(v) is int} if isinstance(files, dict) else {}
    return IncidentIdentity(
        job_id, incident, trace_id, root_attributes,
        stacks={r: e.now for r, e in entries.items() if e.now is not None},
        failed={r: e.failed for r, e in entries.items() if e.failed},
        host={r: e.host for r, e in entries.items() if e.host is not None},
        exits={r: e.exit for r, e in entries.items() if e.exit is not None},
        network=network_from_raw(raw.get("network")),
        summary=summary if isinstance(summary, dict) else {}, files=files, path=path)


class _RankEntry(NamedTuple):
    now: LiveStacks | None
    failed: tuple[FailedCollective, ...]
    host: ProcessFacts | None
    exit: ExitRecord | None


def _rank_entry(doc: Any) -> _RankEntry | None:
    """One rank's entry of an incident file: its stacks at incident time, what failed (where it
    ran is ranks.json's; a host or pid an older file holds here is not read)."""
    if not isinstance(doc, dict):
        return None
    return _RankEntry(stacks_from_raw(doc.get("now")), failed_from_raw(doc.get("failed")), facts_from_raw(doc.get("proc")),
                      exit_from_raw(doc.get("exit")))


def dump_file_sizes(dumps: Mapping[int, RankDump], folder: Path | None = None) -> dict[str, int]:
    """Name -> size of the dumps that are files (in ``folder``, when given): what an identity was written for.
    A coordinator's compact ranks (from node summaries) are no files; each folder is resolved once (at
    100k ranks, resolving every rank's path took seconds)."""
    out: dict[str, int] = {}
    want = folder.resolve() if folder is not None else None
    resolved: dict[Path, Path] = {}
    for d in dumps.values():
        if d.compact:
            continue
        path = Path(d.path)
        if want is not None:
            parent = resolved.get(path.parent)
            if parent is None:
                parent = resolved[path.parent] = path.parent.resolve()
            if parent != want:
                continue
        try:
            out[path.name] = path.stat().st_size
        except OSError:
            continue
    return out
