"""Who this process is: host, pid, local rank and the scheduler's node name, as the agent reports them.

The socket host name is what DCGM and node exporters label their metrics with (so joins
work); Slurm's ``SLURMD_NODENAME`` is what people type into ``scontrol``/``sinfo``. The
record itself (:class:`fr_otel.read.rank_process.RankProcess`) is plain data every other
source fills the same way.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from ..common.names import host_name
from ..read.rank_process import RankProcess

__all__ = ["this_process"]


def this_process(local_rank: int | None, environ: Mapping[str, str] | None = None) -> RankProcess:
    """The calling process; the node name from Slurm's ``SLURMD_NODENAME`` when the job runs under Slurm."""
    env = os.environ if environ is None else environ
    return RankProcess(host=socket.gethostname(), pid=os.getpid(), local_rank=local_rank, source="agent",
                       node=host_name(env.get("SLURMD_NODENAME")))
