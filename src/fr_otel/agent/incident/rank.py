"""What an incident needs of this rank, and where its dumps go.

Known once the process group exists; the runner, the store's gathering and the local
(store-less) incidents all take it, and nothing more of the agent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...incident.delivery import out_dir
from ...otlp.config import ExportConfig
from ...read.dump_location import configured_dump_folder
from ...read.network import NetworkFacts
from ...read.rank_process import RankProcess
from ..links.channel import IncidentChannel
from ..config import AgentConfig
from ..serve.health import HealthTracker
from ..links.host_map import HostMapKeeper
from ..links.node_channel import NodeChannel
from ..links.node_leader import NodeRole
from ..links.reachability import network_facts
from ..observe.proc_state import OomBaseline
from ..observe.recorder import GroupInfo
from ...read.rank_facts import ExitRecord

__all__ = ["COORDINATOR_S_PER_RANK", "DUMP_FILE_PREFIX", "IncidentRank", "Leaving", "dump_path", "dump_root", "incident_budget_s",
           "node_dump_folders"]

DUMP_FILE_PREFIX = "fr_trace_rank_"
#: The coordinator's own work per rank of the job (decoding, the job model, the analysis: 0.31-0.35 ms
#: on a core of its own from 16k to 100k ranks, bench/README.md), with room for a busy host.
COORDINATOR_S_PER_RANK = 0.001


@dataclass(slots=True)
class Leaving:
    """How this rank is leaving, once it is (the exception, SIGTERM, a normal exit): said in its parts and
    exit copy, since nobody else can say it once the process is gone."""

    record: ExitRecord | None = None


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
    #: Where every rank runs, and the heartbeats that say who is still heard from.
    hosts: HostMapKeeper
    #: This rank's part on its node when node leaders are on (:mod:`..links.node_leader`); None: every rank
    #: talks to the job's store itself.
    node: NodeRole | None = None
    #: This node's folder, where its ranks keep their last records (:mod:`..observe.last_record`), leaders or
    #: not; None: no folder could be made (then no silent rank's record is read).
    records: NodeChannel | None = None
    #: The OOM-kill counters at start: an incident reports the kills since (:mod:`..observe.proc_state`).
    oom_baseline: OomBaseline = field(default_factory=OomBaseline.now)
    leaving: Leaving = field(default_factory=Leaving)

    def network_now(self, silent_hosts: set[str], store_lost_since_ns: int | None = None) -> NetworkFacts | None:
        """The store and the other hosts as this node sees them now (bounded probes, see :mod:`..links.reachability`);
        ``store_lost_since_ns``: the store is known not to answer this node since then, whatever this rank's own
        link says (a member whose node leader found it gone made no store call of its own to fail)."""
        since = self.channel.link.unreachable_since_ns or store_lost_since_ns
        return network_facts(self.process.host, self.hosts.processes, self.config.metrics_port, self.channel.address,
                             self.hosts.store_host, since, silent_hosts)


def dump_root(config: AgentConfig) -> Path:
    """The folder incident dumps go to: ``dump_dir``, else ``<out dir>/dumps``."""
    return Path(config.dump_dir) if config.dump_dir else out_dir(config.out_dir) / "dumps"


def node_dump_folders(config: AgentConfig) -> list[Path]:
    """Where this node's dumps go: the incident folders' root, and the folder the job's own dump
    setting names (NCCL's watchdog dumps), when one is set."""
    folders = [dump_root(config)]
    torch_folder = configured_dump_folder()
    if torch_folder is not None and torch_folder not in folders:
        folders.append(torch_folder)
    return folders


def dump_path(me: IncidentRank, trace_hex: str) -> Path:
    return dump_root(me.config) / trace_hex / f"{DUMP_FILE_PREFIX}{me.rank}"


def incident_budget_s(me: IncidentRank) -> float:
    """How long one incident's work may take (the gathering, the coordinator's own work, the export, a
    margin): the bound every rank of it holds its store calls and its wait for the verdict to. It grows with
    the job: a fixed 30 s cut a 100k-rank coordinator off mid-analysis (its work alone is ~35 s there), so
    its verdict, files and whole-recorder request never reached the store."""
    return me.config.gather_seconds + me.world_size * COORDINATOR_S_PER_RANK + me.export_config.timeout_s + 5
