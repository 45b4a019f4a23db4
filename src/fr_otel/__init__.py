"""fr-otel: make hangs in distributed PyTorch training obvious.

Reads PyTorch Flight Recorder dumps (never importing torch), ties them into one
job model, and names the culprit ranks with evidence, as ``fr-otel analyze`` does::

    import fr_otel
    result = fr_otel.analyze_incident("dumps/")   # result.to_json() is `fr-otel analyze dumps/ --json`
    print(result.verdict.verdict, [c.rank for c in result.verdict.culprits])

``__all__`` below is the public API (README lists it); every other module is internal.

Every name is imported on first use (module ``__getattr__``): ``fr-otel --version`` and
``--help`` import this package and must start as fast as a bare interpreter, and a
training script's ``import fr_otel`` must not pay for the analysis it may never run. (Not
even for logging: its ``NullHandler`` comes with the first module that logs,
:mod:`fr_otel.common.log`.)
"""

from importlib import import_module as _import_module

from .version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing at start-up (type checkers know the name)
if TYPE_CHECKING:  # the names __getattr__ serves, as a type checker (the user's too) must see them
    from .agent import start, stop
    from .agent.guest.step_counter import step
    from .diagnosis.analysis import analyze
    from .diagnosis.job import Job, ProcessGroup, build_job
    from .diagnosis.verdict import AnalysisOptions, Culprit, GroupState, Verdict
    from .incident.pipeline import IncidentResult, NoUsableDump, analyze_incident
    from .read.dump import Entry, PgConfig, Progress, RankDump
    from .read.frame import Frame
    from .read.reader import ReadResult, read_dumps
del TYPE_CHECKING  # not part of the package's namespace

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
    "IncidentResult": ".incident.pipeline",
    "NoUsableDump": ".incident.pipeline",
    "analyze_incident": ".incident.pipeline",
    "ReadResult": ".read.reader",
    "read_dumps": ".read.reader",
    "start": ".agent",  # the live agent's, imported only when asked for
    "stop": ".agent",
    "step": ".agent.guest.step_counter",
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
    "IncidentResult",
    "Job",
    "NoUsableDump",
    "PgConfig",
    "ProcessGroup",
    "Progress",
    "RankDump",
    "ReadResult",
    "Verdict",
    "analyze",
    "analyze_incident",
    "build_job",
    "read_dumps",
    "start",
    "step",
    "stop",
    "__version__",
]
