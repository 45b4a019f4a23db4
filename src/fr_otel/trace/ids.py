"""Deterministic trace and span ids: every rank computes the same ids alone.

Ids are blake2b hashes of stable keys (job identity, incident, rank, record), so
ranks or nodes exporting independently land in one trace, and re-exporting the
same dumps yields identical ids. An all-zero id (which backends drop) is never
returned.
"""

from __future__ import annotations

import hashlib
import os
from typing import Mapping

from ..common.names import identity_problem

__all__ = ["hashed_id", "trace_id_for", "span_id_for", "job_identity", "JOB_ID_ENV"]

JOB_ID_ENV = "FR_OTEL_JOB_ID"


def hashed_id(key: str, size: int) -> int:
    """A ``size``-byte id from a stable key: the same key gives the same id anywhere, never 0."""
    value = int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=size).digest(), "big")
    return value or 1


def trace_id_for(job_id: str, incident: str = "") -> int:
    """The 128-bit trace id of one incident of one job (run + restart)."""
    return hashed_id(f"fr-otel/trace\0{job_id}\0{incident}", 16)


def span_id_for(trace_id: int, *key: object) -> int:
    """A 64-bit span id, unique within the trace for a distinct ``key``."""
    return hashed_id(f"{trace_id:032x}\0" + "\0".join(map(str, key)), 8)


def job_identity(explicit: str | None = None, env: Mapping[str, str] | None = None,
                 problems: list[str] | None = None) -> tuple[str | None, str]:
    """The job's identity and where it came from: argument > FR_OTEL_JOB_ID > torchelastic > Slurm.

    Returns (None, "none") when nothing identifies the run; callers then derive one
    from the dumps' content (fine for one export of all ranks, not for independent ones).
    Every source must give an identity (:func:`fr_otel.common.names.identity_problem`): a
    variable that does not is skipped, with one line in ``problems``; an argument that does
    not raises ``ValueError`` (callers check their flags first).
    """
    env = os.environ if env is None else env
    if explicit:
        why = identity_problem(explicit)
        if why:
            raise ValueError(why)
        return explicit, "argument"
    candidates = [(JOB_ID_ENV, env.get(JOB_ID_ENV))]
    run_id = env.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        candidates.append(("TORCHELASTIC_RUN_ID", f"torchelastic:{run_id}/restart-{restart}"))
    slurm = env.get("SLURM_JOB_ID")
    if slurm:
        candidates.append(("SLURM_JOB_ID", f"slurm:{slurm}/restart-{env.get('SLURM_RESTART_COUNT', '0')}"))
    for source, value in candidates:
        if not value:
            continue
        why = identity_problem(value)
        if why is None:
            return value, source
        if problems is not None:
            problems.append(f"{source}: {why}")
    return None, "none"
