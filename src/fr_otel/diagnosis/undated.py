"""Undated dumps of a job caught at work: which reading the verdict takes, and the note that says why.

Read as stopped when dumped, a hang's waits converge on a few ranks (or one host's); a running job's ops in
flight scatter over many ranks and hosts, each group its own (see :mod:`.pace` for when dumps read as at work,
and :func:`~.analysis.analyze` for the two readings).
"""

from __future__ import annotations

from ..common.clock import format_clock
from ..common.ranks import compress_ranks
from .job import Job
from .kinds import VerdictWord
from .pace import Clock
from .verdict import Verdict

__all__ = ["SCATTERED_CULPRITS", "scattered", "undated_note"]


#: Undated waits read as stopped that blame this many ranks, on more than one host, scatter as a running job's
#: ops in flight do (each group its own), where a hang's converge (simulated 3D snapshots: 10-20 of 32 ranks on
#: 4 hosts; hangs: 1-2 ranks, or one host's).
SCATTERED_CULPRITS = 3


def scattered(job: Job, blamed: list[int]) -> bool:
    """The ranks undated waits read as stopped would blame scatter over many ranks and hosts (a rank whose host
    is unknown counts as a host of its own)."""
    hosts = job.hosts
    return len(blamed) >= SCATTERED_CULPRITS and len({hosts.get(r) or f"rank {r}" for r in blamed}) > 1


def undated_note(job: Job, clock: Clock, as_stopped: Verdict, verdict: VerdictWord, reading: str,
                 straggling: list[int] | None = None) -> str:
    """Which reading undated dumps of a job at work got (``reading``: "stopped" when dumped, the others waiting for
    a "straggler" late step after step (``straggling``), or a "snapshot" whose waits, counted stuck, would
    scatter), why, and what would settle it; said as the final ``verdict`` stands."""
    assert clock.at_work_ns is not None
    quiet = max((clock.at_work_ns - d.latest_ns) / 1e9 for d in job.dumps.values())
    head = (f"no dump time (the files' dates are not believable): every rank was active within {quiet:.2f} s of the "
            f"newest recorded activity, {format_clock(clock.at_work_ns)} (a rank's usual longest pause is "
            f"{clock.pace.pause_s or 0:.2f} s)")
    tail = "; the dumps' own times (files copied with their dates: cp -p, rsync -t) would settle it"
    blamed = [c.rank for c in as_stopped.culprits if c.blamed]
    if reading == "stopped":
        shape = f", and the waits converge on rank(s) {compress_ranks(blamed)}, as in a hang" if blamed else ""
        return f"{head}{shape}: read as stopped when dumped, every wait counted{tail}"
    if clock.old:
        return (f"{head}; its ages measured to it are lower bounds, and some wait is past the stall threshold even "
                f"so{tail}")
    if reading == "straggler":
        said = (": read as the others waiting for a straggler (had it stopped since, it would look the same: a hang "
                "on it)") if verdict == VerdictWord.STRAGGLER else ""
        return (f"{head}; the waits converge on rank(s) {compress_ranks(straggling or blamed)}, which the lateness "
                f"history shows late step after step, and none measured to it is past the stall threshold (ages are "
                f"lower bounds){said}{tail}")
    hosts = job.hosts
    where = len({hosts.get(r) or f"rank {r}" for r in blamed})
    return (f"{head}; no wait measured to it is past the stall threshold (ages are lower bounds); counted stuck, the "
            f"waits would blame {len(blamed)} ranks on {where} host(s), scattered as a running job's ops in flight "
            "are, where a hang converges on the ranks it waits on: this reads as a snapshot of a running job, but "
            f"without dump times a hang dumped at once cannot be ruled out{tail}")
