"""A node's ranks as the incident code sees them (IncidentRank with a NodeRole), on a real TCPStore."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from fr_otel.agent.links.channel import IncidentChannel
from fr_otel.agent.config import AgentConfig
from fr_otel.agent.serve.health import HealthTracker
from fr_otel.agent.links.host_map import HostMapKeeper
from fr_otel.agent.incident.rank import IncidentRank
from fr_otel.agent.links.node_channel import NodeChannel
from fr_otel.agent.links.node_leader import NodeRole
from fr_otel.agent.links.signing import Seal
from fr_otel.otlp.config import resolve_export_config
from fr_otel.read.rank_process import RankProcess


def store_channel(port: int, seal: Seal | None = None) -> IncidentChannel:
    """A client of the store on ``port``, as a rank's incident channel. Its connect may take seconds on a loaded
    box (a 5 s bound once timed out with four workers on two cores); every call the channel makes is bounded by
    its own link whatever this timeout."""
    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    return IncidentChannel(dist.PrefixStore("fr_otel/job/", client), "test", seal=seal)


def node_rank(tmp_path: Path, port: int, rank: int, poll: float, max_incidents: int = 10) -> IncidentRank:
    """Rank ``rank`` of node-a in a 4-rank job (rank 0 leads), its node folder under ``tmp_path``."""
    channel = store_channel(port)
    process = RankProcess(host="node-a", pid=100 + rank, local_rank=rank, source="agent")
    role = NodeRole(channel, NodeChannel(tmp_path / "node-a", rank), rank, process, leader=rank == 0,
                    poll_interval=poll, world_size=4)
    config = AgentConfig(out_dir=str(tmp_path), dump_dir=str(tmp_path), metrics_port=None, poll_interval=poll,
                         max_incidents=max_incidents)
    return IncidentRank(config, resolve_export_config(environ={}, timeout_s=5), HealthTracker(), channel, "job", rank,
                        4, process, lambda: b"", tuple, HostMapKeeper(channel, rank, 4, process, leader=False,
                                                                      folders=list), node=role)


def flat_rank(tmp_path: Path, port: int, rank: int, *, host: str = "node0", world: int = 4, poll: float = 0.2,
              gather_seconds: float = 15.0, seal: Seal | None = None) -> IncidentRank:
    """Rank ``rank`` of a ``world``-rank job on ``host`` without a node leader (the flat path); ``seal``: the
    job's secret, its records signed."""
    channel = store_channel(port, seal)
    process = RankProcess(host=host, pid=100 + rank, local_rank=0, source="agent")
    config = AgentConfig(out_dir=str(tmp_path), dump_dir=str(tmp_path), metrics_port=None, poll_interval=poll,
                         gather_seconds=gather_seconds)
    return IncidentRank(config, resolve_export_config(environ={}, timeout_s=5), HealthTracker(), channel, "job", rank,
                        world, process, lambda: b"", tuple,
                        HostMapKeeper(channel, rank, world, process, leader=False, folders=list))
