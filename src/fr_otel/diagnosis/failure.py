"""A job its own code ended: the ``failure`` verdict, naming the ranks that raised and their exceptions.

The recorder shows collectives, not exceptions: a job whose every rank raised at step 0 left recorders with
nothing in flight (it would read healthy), and one whose culprit raised and whose launcher then tore the
others down left a hang's shape (it would read hang, long after nothing hangs). Each rank's exit record
(:class:`fr_otel.read.rank_facts.ExitRecord`) says how it left: a rank that raised its own exception
(``exception``, never a collective's failure or SIGTERM, which are how a hang ends) is why the job failed.
So where a rank raised and either nothing is stuck, or every rank of the job has left (an exit record, or its
process gone), or the incident was raised as the job ended (``AnalysisOptions.ending``) and a rank the others
wait on is one that raised, the verdict is ``failure``, its culprits the ranks that raised, the first to raise
first. No torch.
"""

from __future__ import annotations

from .job import Job

__all__ = ["job_ended", "raised_ranks"]


def raised_ranks(job: Job) -> list[int]:
    """The ranks whose own code raised, the first to raise first."""
    raised = {r: e for r, e in job.exits.items() if e.how == "exception"}
    return sorted(raised, key=lambda r: (raised[r].at_ns or 1 << 62, r))


def job_ended(job: Job) -> bool:
    """Every rank of the job has left: an exit record, or a host saw its process gone."""
    ranks = set(range(job.world_size)) if job.world_size else set(job.dumps) | set(job.exits)
    facts = job.host_facts
    return bool(ranks) and all(r in job.exits or (r in facts and facts[r].gone) for r in ranks)
