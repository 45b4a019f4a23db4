"""Who this process is: host, pid, local rank and the scheduler's node name, as the agent reports them; how many
ranks share its node and the node's number, as the launcher says.

The socket host name is what DCGM and node exporters label their metrics with (so joins
work); Slurm's ``SLURMD_NODENAME`` is what people type into ``scontrol``/``sinfo``, and in Kubernetes (where
the host name is the pod's) ``FR_OTEL_NODE_NAME``, set from the downward API's ``spec.nodeName``, is what
``kubectl cordon`` takes. The
record itself (:class:`fr_otel.read.rank_process.RankProcess`) is plain data every other
source fills the same way.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from ...common.names import host_name
from ...read.rank_process import RankProcess
from ..config import FR_OTEL_NODE_NAME

__all__ = ["local_world_size", "node_number", "this_process"]


def this_process(local_rank: int | None, environ: Mapping[str, str] | None = None) -> RankProcess:
    """The calling process; the node name from Slurm's ``SLURMD_NODENAME``, else ``FR_OTEL_NODE_NAME``."""
    env = os.environ if environ is None else environ
    node = host_name(env.get("SLURMD_NODENAME")) or host_name(env.get(FR_OTEL_NODE_NAME, "").strip())
    return RankProcess(host=socket.gethostname(), pid=os.getpid(), local_rank=local_rank, source="agent", node=node)


def local_world_size(environ: Mapping[str, str]) -> int | None:
    """How many ranks run on this node: torchrun's LOCAL_WORLD_SIZE, else Slurm's tasks per node."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        raw = environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


def node_number(environ: Mapping[str, str]) -> str:
    """This node's number in the job: torchrun's GROUP_RANK, else Slurm's SLURM_NODEID; "" when neither says."""
    for name in ("GROUP_RANK", "SLURM_NODEID"):
        raw = environ.get(name, "").strip()
        if raw.isascii() and raw.isdigit():
            return raw
    return ""
