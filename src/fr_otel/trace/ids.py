"""The job's identity, the key every trace id of its incidents is derived from (:mod:`fr_otel.common.ids`).

Explicit > ``FR_OTEL_JOB_ID`` > torchelastic's run id > Slurm's job id, each checked as an
identity; every rank of a run finds the same one without talking to the others.
"""

from __future__ import annotations

import os
from typing import Mapping

from ..common.names import identity_problem

__all__ = ["JOB_ID_ENV", "job_identity"]

JOB_ID_ENV = "FR_OTEL_JOB_ID"


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
