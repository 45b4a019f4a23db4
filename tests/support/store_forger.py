"""Anyone who reaches a running job's TCPStore: keys written straight into the agents' part of it."""

from __future__ import annotations

import re
from datetime import timedelta

import torch.distributed as dist

from fr_otel.agent.links.channel import job_digest

__all__ = ["plant_in_job"]

#: The agent's debug line that names its store and its job (FR_OTEL_LOG_LEVEL=debug).
_CHANNEL = re.compile(r"incidents through own connection to ([^\s:]+):(\d+), job id (\S+?)(?:;|$)", re.MULTILINE)


def plant_in_job(log: str, keys: dict[str, str | bytes]) -> None:
    """Write ``keys`` (relative to the agents' prefix) into the store of the job whose debug log is ``log``: the
    store and the job its agents name there (what anyone on the job's network can find out)."""
    found = _CHANNEL.search(log)
    assert found, "no agent named its store yet"
    host, port, job_id = found.groups()
    client = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
    store = dist.PrefixStore(f"{job_digest(job_id)}/", dist.PrefixStore("fr_otel/", client))  # as the agents nest it
    assert store.check(["host/0"]), f"no agent of job {job_id} said where it runs in {host}:{port}"
    for key, value in keys.items():
        store.set(key, value)
        assert store.check([key]), f"{key} not in the store after its set"
