"""fr-otel: make hangs in distributed PyTorch training obvious.

Reads PyTorch Flight Recorder dumps (never importing torch), ties them into one
job model, and names the culprit ranks with evidence::

    from fr_otel import read_dumps, build_job, analyze
    verdict = analyze(build_job(read_dumps("dumps/")))
    print(verdict.verdict, [c.rank for c in verdict.culprits])
"""

import logging as _logging

from .diagnosis.analysis import analyze
from .diagnosis.job import Job, ProcessGroup, build_job
from .diagnosis.verdict import AnalysisOptions, Culprit, GroupState, Verdict
from .read.dump import Entry, PgConfig, Progress, RankDump
from .read.frame import Frame
from .read.reader import ReadResult, read_dumps
from .version import __version__

# A library logs, the application decides where it goes (stdlib convention).
_logging.getLogger("fr_otel").addHandler(_logging.NullHandler())


def __getattr__(name: str) -> object:
    """``fr_otel.start`` / ``stop`` / ``step``: the live agent's, imported only when asked for."""
    if name in ("start", "stop"):
        from . import agent

        return getattr(agent, name)
    if name == "step":
        from .agent.step_counter import step

        globals()["step"] = step  # a training loop calls it every step: look it up once
        return step
    raise AttributeError(f"module 'fr_otel' has no attribute {name!r}")


__all__ = [
    "AnalysisOptions",
    "Culprit",
    "Entry",
    "Frame",
    "GroupState",
    "Job",
    "PgConfig",
    "ProcessGroup",
    "Progress",
    "RankDump",
    "ReadResult",
    "Verdict",
    "analyze",
    "build_job",
    "read_dumps",
    "start",
    "step",
    "stop",
    "__version__",
]
