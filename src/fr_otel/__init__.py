"""fr-otel: make hangs in distributed PyTorch training obvious.

Reads PyTorch Flight Recorder dumps (never importing torch), ties them into one
job model, and names the culprit ranks with evidence::

    from fr_otel import read_dumps, build_job, analyze
    verdict = analyze(build_job(read_dumps("dumps/")))
    print(verdict.verdict, [c.rank for c in verdict.culprits])

Every name is imported on first use (module ``__getattr__``): ``fr-otel --version`` and
``--help`` import this package and must start as fast as a bare interpreter, and a
training script's ``import fr_otel`` must not pay for the analysis it may never run. (Not
even for logging: its ``NullHandler`` comes with the first module that logs,
:mod:`fr_otel.common.log`.)
"""

from importlib import import_module as _import_module

from .version import __version__

#: Public name -> the module that defines it (relative to this package).
_HOMES = {
    "analyze": ".diagnosis.analysis",
    "Job": ".diagnosis.job",
    "ProcessGroup": ".diagnosis.job",
    "build_job": ".diagnosis.job",
    "AnalysisOptions": ".diagnosis.verdict",
    "Culprit": ".diagnosis.verdict",
    "GroupState": ".diagnosis.verdict",
    "Verdict": ".diagnosis.verdict",
    "Entry": ".read.dump",
    "PgConfig": ".read.dump",
    "Progress": ".read.dump",
    "RankDump": ".read.dump",
    "Frame": ".read.frame",
    "ReadResult": ".read.reader",
    "read_dumps": ".read.reader",
    "start": ".agent",  # the live agent's, imported only when asked for
    "stop": ".agent",
    "step": ".agent.step_counter",
}


def __getattr__(name: str) -> object:
    """The public name ``name``, imported from its home on first use and kept (a training loop
    calls ``fr_otel.step`` every step: it is looked up once)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'fr_otel' has no attribute {name!r}")
    value = getattr(_import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


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
