"""Every setting of the live agent, and every ``FR_OTEL_*`` variable it reads, in one place.

Precedence is the one OpenTelemetry uses everywhere::

    start(...) argument / `fr-otel run` flag  >  FR_OTEL_* variable  >  default

(``fr-otel run`` turns its flags into the variables, so in a launched job the flag wins.)
Export settings are the standard ``OTEL_EXPORTER_OTLP_*`` variables, resolved by
:mod:`fr_otel.otlp.config`; ``endpoint``/``protocol``/``headers``/``export_timeout`` here
are only explicit overrides of them.

A bad value never stops training: :func:`resolve_config` returns the default for it and a
line saying why, which the agent logs once. Every number has a range (:attr:`Option.bounds`):
one outside it (``FR_OTEL_POLL_INTERVAL=1e300``, a wait no clock can hold) is a bad value
like any other. No torch import here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..common.names import MAX_IDENTITY, identity_problem
from ..common.stall import DEFAULT_STALL_S
from ..incident.delivery import DEFAULT_OUT_DIR, OUT_DIR_ENV
from ..trace.ids import JOB_ID_ENV
from .guest.role import FR_OTEL_RANK_PID

__all__ = [
    "DEFAULT_METRICS_ADDR",
    "DEFAULT_METRICS_PORT",
    "ENV_VARS",
    "FR_OTEL_AGENT_PID",
    "FR_OTEL_AUTOSTART",
    "FR_OTEL_DUMP_DIR",
    "FR_OTEL_ENABLED",
    "FR_OTEL_ENABLE_RECORDER",
    "FR_OTEL_FLUSH_TIMEOUT",
    "FR_OTEL_GATHER_SECONDS",
    "FR_OTEL_HOOKS",
    "FR_OTEL_INCIDENTS",
    "FR_OTEL_INCIDENT_ENTRIES",
    "FR_OTEL_LOG_LEVEL",
    "FR_OTEL_MAX_INCIDENTS",
    "FR_OTEL_METRICS_ADDR",
    "FR_OTEL_METRICS_PORT",
    "FR_OTEL_NODE_DIR",
    "FR_OTEL_NODE_LEADERS",
    "FR_OTEL_ON_HANG",
    "FR_OTEL_ABORT_AFTER_SECONDS",
    "FR_OTEL_ABORT_MARK",
    "FR_OTEL_NODE_NAME",
    "FR_OTEL_PG_WARN_SECONDS",
    "FR_OTEL_POLL_INTERVAL",
    "FR_OTEL_RANK_PID",
    "FR_OTEL_RECORDER_CAPACITY",
    "FR_OTEL_STALL_SECONDS",
    "FR_OTEL_SUSPECT_SECONDS",
    "FR_OTEL_WAIT_SAMPLE_INTERVAL",
    "OPTIONS",
    "AgentConfig",
    "Option",
    "launch_environment",
    "resolve_config",
]

# --- Environment variables ------------------------------------------------------------
# Defaults live in OPTIONS below (and `fr-otel run --help` prints them from there), not here.

#: ``false`` turns :func:`fr_otel.start` (and the ``fr-otel run`` bootstrap) into a no-op.
FR_OTEL_ENABLED = "FR_OTEL_ENABLED"
#: Set by ``fr-otel run``: the bootstrap ``sitecustomize`` starts the agent in each rank.
FR_OTEL_AUTOSTART = "FR_OTEL_AUTOSTART"
#: Seconds between two cheap reads of the recorder's progress counters.
FR_OTEL_POLL_INTERVAL = "FR_OTEL_POLL_INTERVAL"
#: A collective in flight longer than min(this, half its timeout) raises an incident.
FR_OTEL_STALL_SECONDS = "FR_OTEL_STALL_SECONDS"
#: A collective in flight this long costs one full recorder read, to learn its op, timeout
#: and exact age (never more than half the stall threshold).
FR_OTEL_SUSPECT_SECONDS = "FR_OTEL_SUSPECT_SECONDS"
#: Mean seconds between two samples of the progress counters that measure how long this rank
#: waits in collectives (the slow-rank signal, :mod:`fr_otel.agent.observe.wait_sampler`); ``off`` disables.
FR_OTEL_WAIT_SAMPLE_INTERVAL = "FR_OTEL_WAIT_SAMPLE_INTERVAL"
#: Base port of ``/metrics``; each rank serves ``base + LOCAL_RANK``. ``off`` disables it,
#: ``0`` picks a free port (logged).
FR_OTEL_METRICS_PORT = "FR_OTEL_METRICS_PORT"
#: Address ``/metrics`` binds; a cluster's Prometheus must be able to reach it.
FR_OTEL_METRICS_ADDR = "FR_OTEL_METRICS_ADDR"
#: Recorder entries per rank; set before the process group exists, it sets TORCH_FR_BUFFER_SIZE.
FR_OTEL_RECORDER_CAPACITY = "FR_OTEL_RECORDER_CAPACITY"
#: ``true``: when the recorder is off and no process group exists yet, turn it on.
FR_OTEL_ENABLE_RECORDER = "FR_OTEL_ENABLE_RECORDER"
#: ``false``: no cross-rank incidents (metrics only).
FR_OTEL_INCIDENTS = "FR_OTEL_INCIDENTS"
#: Where each rank writes its recorder on an incident (unset: a ``dumps`` folder in the out dir).
FR_OTEL_DUMP_DIR = "FR_OTEL_DUMP_DIR"
#: How long the incident's coordinator waits for the other ranks' recorders.
FR_OTEL_GATHER_SECONDS = "FR_OTEL_GATHER_SECONDS"
#: Upper bound on a flush at exit, on an uncaught exception or SIGTERM (keep it under the 30 s
#: torchrun waits between SIGTERM and SIGKILL).
FR_OTEL_FLUSH_TIMEOUT = "FR_OTEL_FLUSH_TIMEOUT"
#: Incidents one job may raise: a flapping job cannot flood the collector.
FR_OTEL_MAX_INCIDENTS = "FR_OTEL_MAX_INCIDENTS"
#: Recorder entries per group a rank sends the coordinator (plus all in flight); the local
#: dump file always holds everything.
FR_OTEL_INCIDENT_ENTRIES = "FR_OTEL_INCIDENT_ENTRIES"
#: An agent whose process has no process group this long after it started says so, once: a
#: rank that never calls ``init_process_group`` (or a process that is no rank) gets no agent.
FR_OTEL_PG_WARN_SECONDS = "FR_OTEL_PG_WARN_SECONDS"
#: Comma list of ``atexit``, ``excepthook``, ``sigterm``, or ``none``.
FR_OTEL_HOOKS = "FR_OTEL_HOOKS"
#: ``debug``, ``info`` (one start-up line on local rank 0, incidents), ``warning`` (problems
#: only) or ``error``; the agent logs to stderr.
FR_OTEL_LOG_LEVEL = "FR_OTEL_LOG_LEVEL"
#: ``auto``: in a multi-node job one agent per node talks to the job's store for the node and sends
#: one summary of it at an incident; ``on``/``off`` force it (see :mod:`fr_otel.agent.links.node_leader`).
FR_OTEL_NODE_LEADERS = "FR_OTEL_NODE_LEADERS"
#: Node-local folder a node's ranks share with their leader (a RAM file system where there is one).
FR_OTEL_NODE_DIR = "FR_OTEL_NODE_DIR"
#: ``report``: an incident is reported and the job left as it is; ``abort``: once a hang's verdict is
#: delivered, every rank stuck in that hang's collective ends its process with
#: :data:`~fr_otel.agent.hang_abort.ABORT_EXIT_CODE`, so the launcher restarts the job (:mod:`fr_otel.agent.hang_abort`).
FR_OTEL_ON_HANG = "FR_OTEL_ON_HANG"
#: With ``abort``: how long a rank's own collective must have been in flight before it ends (unset: the
#: stall threshold, :attr:`AgentConfig.abort_after_s`).
FR_OTEL_ABORT_AFTER_SECONDS = "FR_OTEL_ABORT_AFTER_SECONDS"
#: The scheduler's name for this machine where the host name is not it (a Kubernetes pod's: set it from the
#: downward API's ``spec.nodeName``); Slurm's ``SLURMD_NODENAME`` comes first.
FR_OTEL_NODE_NAME = "FR_OTEL_NODE_NAME"
#: Set by ``fr-otel run --on-hang abort``: a file each rank that ends a hang appends its rank to, so
#: ``fr-otel run`` exits with the abort's code where torchrun exits 1 for any failed worker.
FR_OTEL_ABORT_MARK = "FR_OTEL_ABORT_MARK"
#: Set by the agent to its process id once its process has a process group (a rank), so child
#: processes (data loader workers, subprocesses) that inherit the environment do not start
#: agents of their own. Not before: a launcher's workers inherit its environment too.
FR_OTEL_AGENT_PID = "FR_OTEL_AGENT_PID"

#: Not OpenTelemetry's 9464 (its Prometheus exporter) nor DCGM's 9400.
DEFAULT_METRICS_PORT = 9740
DEFAULT_METRICS_ADDR = "0.0.0.0"
HOOK_NAMES = ("atexit", "excepthook", "sigterm")
NODE_LEADER_MODES = ("auto", "on", "off")
LOG_LEVELS = ("debug", "info", "warning", "error")
ON_HANG = ("report", "abort")


# --- Parsers ----------------------------------------------------------------------------

def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _positive(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (number > 0 and math.isfinite(number)):
        raise ValueError(f"expected a positive number of seconds, got {value!r}")
    return number


def _count(value: Any) -> int:
    try:
        number = float(value)
        whole = not isinstance(value, bool) and math.isfinite(number) and number == int(number) and number >= 0
    except (TypeError, ValueError):
        whole = False
    if not whole:
        raise ValueError(f"expected a whole number >= 0, got {value!r}")
    return int(float(value))


def _interval_or_off(value: Any) -> float | None:
    if value is None or str(value).strip().lower() in ("off", "none", "false"):
        return None
    return _positive(value)


def _port(value: Any) -> int | None:
    if value is None or str(value).strip().lower() in ("off", "none", "false", "-1", ""):
        return None
    port = _count(value)
    if port > 65535:
        raise ValueError(f"expected a port 0-65535 or 'off', got {value!r}")
    return port


def _optional_count(value: Any) -> int | None:
    return None if value is None or str(value).strip() == "" else _count(value)


def _text(value: Any) -> str | None:
    text = "" if value is None else str(value).strip()
    return text or None


def _identity(value: Any) -> str | None:
    text = _text(value)
    why = identity_problem(text) if text is not None else None
    if why:
        raise ValueError(why)
    return text


def _hooks(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    names = tuple(dict.fromkeys(str(i).strip().lower() for i in items if str(i).strip()))
    if names in ((), ("none",)):
        return ()
    unknown = [n for n in names if n not in HOOK_NAMES]
    if unknown:
        raise ValueError(f"unknown hook(s) {unknown}; expected a comma list of {', '.join(HOOK_NAMES)} or none")
    return names


def _node_leaders(value: Any) -> str:
    text = str(value).strip().lower()
    text = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}.get(text, text)
    if text not in NODE_LEADER_MODES:
        raise ValueError(f"expected one of {', '.join(NODE_LEADER_MODES)}, got {value!r}")
    return text


def _on_hang(value: Any) -> str:
    text = str(value).strip().lower()
    if text not in ON_HANG:
        raise ValueError(f"expected one of {', '.join(ON_HANG)}, got {value!r}")
    return text


def _positive_or_unset(value: Any) -> float | None:
    return None if value is None or str(value).strip() == "" else _positive(value)


def _log_level(value: Any) -> str:
    text = str(value).strip().lower()
    if text not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return text


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The resolved settings: one field per row of :data:`OPTIONS` (what each means is there; the
    default is here, its one home), then explicit overrides of the standard OTLP variables."""

    enabled: bool = True
    poll_interval: float = 1.0
    stall_seconds: float = DEFAULT_STALL_S
    suspect_seconds: float = 5.0
    wait_sample_interval: float | None = 0.1
    metrics_port: int | None = DEFAULT_METRICS_PORT
    metrics_addr: str | None = DEFAULT_METRICS_ADDR
    recorder_capacity: int | None = None
    enable_recorder: bool = True
    incidents: bool = True
    dump_dir: str | None = None
    out_dir: str | None = None
    job_id: str | None = None
    gather_seconds: float = 15.0
    flush_timeout: float = 20.0
    max_incidents: int = 10
    incident_entries: int = 64
    pg_warn_seconds: float = 300.0
    hooks: tuple[str, ...] = HOOK_NAMES
    log_level: str = "info"
    node_leaders: str = "auto"
    node_dir: str | None = None
    on_hang: str = "report"
    abort_after_seconds: float | None = None  # None: stall_seconds
    endpoint: str | None = None
    protocol: str | None = None
    headers: str | None = None
    export_timeout: float | None = None

    @property
    def refine_after_s(self) -> float:
        """When a collective in flight earns a full read: never later than half the threshold."""
        return min(self.suspect_seconds, self.stall_seconds / 2)

    @property
    def abort_after_s(self) -> float:
        """How long this rank's own collective of a hang must have been in flight before ``abort`` ends it: never
        less than the stall threshold (a verdict read from the store must not end a rank whose collective is
        merely slow, e.g. during a checkpoint shorter than the threshold)."""
        return max(self.stall_seconds, self.abort_after_seconds or 0.0)


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(AgentConfig)}


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: its ``start()`` keyword, variable, ``fr-otel run`` flag, parser and range."""

    name: str
    env: str
    flag: str
    parse: Callable[[Any], Any]
    help: str
    #: What the value is, for ``--help`` (e.g. ``SECONDS``).
    metavar: str = "VALUE"
    #: The values it may take, in words (``--help`` and docs/agent.md's options table say it).
    allowed: str = ""
    #: A number's inclusive range (``off``/unset, None, is outside the question); None: not a number.
    bounds: tuple[float, float] | None = None

    @property
    def default(self) -> Any:
        """Its :class:`AgentConfig` field's default."""
        return _DEFAULTS[self.name]

    def parse_in_range(self, value: Any) -> Any:
        """``parse``, then the range: a value outside it is refused (ValueError) like a malformed one, so
        nothing downstream meets a wait of 1e300 seconds or a recorder of 10**12 entries."""
        parsed = self.parse(value)
        if self.bounds is not None and isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
            low, high = self.bounds
            if not low <= parsed <= high:
                raise ValueError(f"{value!r} is out of range (expected {self.allowed})")
        return parsed


def _range(low: float, high: float, unit: str, *, off: bool = False) -> dict[str, Any]:
    """An option's ``allowed`` text and ``bounds`` for a number from ``low`` to ``high``."""
    return {"allowed": f"{low:g} to {high:g}{unit}" + (", or off" if off else ""), "bounds": (low, high)}


_WEEK_S = 7 * 24 * 3600.0
_SECONDS = " s"


#: The table behind ``start(**options)``, the variables and ``fr-otel run``'s flags.
OPTIONS: tuple[Option, ...] = (
    Option("enabled", FR_OTEL_ENABLED, "--enabled", _bool, "false: do nothing at all", "BOOL", "true or false"),
    Option("poll_interval", FR_OTEL_POLL_INTERVAL, "--poll-interval", _positive,
           "seconds between cheap reads of the recorder's progress counters", "SECONDS",
           **_range(0.01, 60, _SECONDS)),
    Option("stall_seconds", FR_OTEL_STALL_SECONDS, "--stall-seconds", _positive,
           "in flight longer than min(this, half its timeout): incident", "SECONDS", **_range(0.1, _WEEK_S, _SECONDS)),
    Option("suspect_seconds", FR_OTEL_SUSPECT_SECONDS, "--suspect-seconds", _positive,
           "in flight this long: one full recorder read (op, timeout, exact age)", "SECONDS",
           **_range(0.1, _WEEK_S, _SECONDS)),
    Option("wait_sample_interval", FR_OTEL_WAIT_SAMPLE_INTERVAL, "--wait-sample-interval", _interval_or_off,
           "mean seconds between samples of the progress counters that measure each rank's wait in collectives "
           "(the slow-rank signal); off disables", "SECONDS", **_range(0.001, 60, _SECONDS, off=True)),
    Option("metrics_port", FR_OTEL_METRICS_PORT, "--metrics-port", _port,
           "base port of /metrics (rank serves base + LOCAL_RANK); off disables", "PORT",
           **_range(0, 65535, "", off=True)),
    Option("metrics_addr", FR_OTEL_METRICS_ADDR, "--metrics-addr", _text,
           "address /metrics binds", "ADDR", "an address of this host"),
    Option("recorder_capacity", FR_OTEL_RECORDER_CAPACITY, "--recorder-capacity", _optional_count,
           "recorder entries, set as TORCH_FR_BUFFER_SIZE when started before the process group (default: torch's)", "N",
           **_range(0, 100_000, " entries")),
    Option("enable_recorder", FR_OTEL_ENABLE_RECORDER, "--enable-recorder", _bool,
           "turn an off recorder on when started before the process group", "BOOL", "true or false"),
    Option("incidents", FR_OTEL_INCIDENTS, "--incidents", _bool,
           "raise and join cross-rank incidents through the job's store", "BOOL", "true or false"),
    Option("dump_dir", FR_OTEL_DUMP_DIR, "--dump-dir", _text,
           "folder for per-incident dump files (default: OUT/dumps)", "DIR", "a folder"),
    Option("out_dir", OUT_DIR_ENV, "--out", _text,
           f"folder for embedded trace files and spools (default: ./{DEFAULT_OUT_DIR})", "DIR", "a folder"),
    Option("job_id", JOB_ID_ENV, "--job-id", _identity,
           "job identity for trace ids (default: torchelastic/Slurm run id, else agreed via the store)", "ID",
           f"printable text, at most {MAX_IDENTITY} characters"),
    Option("gather_seconds", FR_OTEL_GATHER_SECONDS, "--gather-seconds", _positive,
           "how long the coordinator waits for the other ranks' recorders", "SECONDS", **_range(0.1, 3600, _SECONDS)),
    Option("flush_timeout", FR_OTEL_FLUSH_TIMEOUT, "--flush-timeout", _positive,
           "bound on a flush at exit / exception / SIGTERM", "SECONDS", **_range(0.1, 3600, _SECONDS)),
    Option("max_incidents", FR_OTEL_MAX_INCIDENTS, "--max-incidents", _count,
           "incidents one job may raise", "N", **_range(0, 1000, "")),
    Option("incident_entries", FR_OTEL_INCIDENT_ENTRIES, "--incident-entries", _count,
           "entries per group each rank sends the coordinator, besides those in flight", "N",
           **_range(0, 100_000, "")),
    Option("pg_warn_seconds", FR_OTEL_PG_WARN_SECONDS, "--pg-warn-seconds", _positive,
           "no process group this long after the agent started: one warning (never in a launcher)", "SECONDS",
           **_range(0.1, _WEEK_S, _SECONDS)),
    Option("hooks", FR_OTEL_HOOKS, "--hooks", _hooks,
           "comma list of atexit,excepthook,sigterm, or none", "HOOKS", "a comma list of atexit, excepthook, sigterm; or none"),
    Option("log_level", FR_OTEL_LOG_LEVEL, "--log-level", _log_level,
           "the agent's stderr log level: debug, info, warning (problems only) or error", "LEVEL",
           "debug, info, warning or error"),
    Option("node_leaders", FR_OTEL_NODE_LEADERS, "--node-leaders", _node_leaders,
           "auto: one agent per node talks to the job's store in multi-node jobs; on or off force it", "MODE",
           "auto, on or off"),
    Option("node_dir", FR_OTEL_NODE_DIR, "--node-dir", _text,
           "node-local folder a node's ranks share with their leader (default: /dev/shm)", "DIR",
           "a folder of yours that no one else may enter"),
    Option("on_hang", FR_OTEL_ON_HANG, "--on-hang", _on_hang,
           "report: report a hang and leave the job be; abort: once a hang's verdict is delivered, end every rank "
           "stuck in it: exit code 70 for a fault in the job's own code (fix it), else 75 so the launcher restarts "
           "the job", "ACTION", "report or abort"),
    Option("abort_after_seconds", FR_OTEL_ABORT_AFTER_SECONDS, "--abort-after-seconds", _positive_or_unset,
           "with --on-hang abort: a rank ends only once its own collective of the hang is this old "
           "(default: the stall threshold)", "SECONDS", **_range(0.1, _WEEK_S, _SECONDS)),
)

#: Every ``FR_OTEL_*`` variable the agent reads (besides the standard OTEL_* ones).
ENV_VARS: tuple[str, ...] = tuple(o.env for o in OPTIONS)


#: OTLP overrides of ``start()`` (None: the standard OTEL_EXPORTER_OTLP_* variables decide).
_EXPORT_OVERRIDES: tuple[tuple[str, Any], ...] = (
    ("endpoint", str), ("protocol", str), ("headers", str), ("export_timeout", float))


def _first_valid(option: Option, candidates: list[tuple[str, Any]], problems: list[str]) -> tuple[int, Any]:
    """Index and parsed value of the first candidate that parses (-1 and the default if none);
    one line in ``problems`` per candidate that does not."""
    for i, (source, candidate) in enumerate(candidates):
        try:
            return i, option.parse_in_range(candidate)
        except (TypeError, ValueError) as exc:
            problems.append(f"{source}: {exc}; ignored")
    return -1, option.default


def resolve_config(
    overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[AgentConfig, list[str]]:
    """Arguments over ``FR_OTEL_*`` over defaults; returns the config and one line per bad value.

    An unknown or invalid argument, or an invalid variable, falls back to the next source
    (argument -> variable -> default) and is reported, never raised.
    """
    env = os.environ if environ is None else environ
    overrides = dict(overrides or {})
    problems: list[str] = []
    values: dict[str, Any] = {}
    known = {o.name for o in OPTIONS} | {name for name, _ in _EXPORT_OVERRIDES}
    for name in sorted(set(overrides) - known):
        problems.append(f"unknown option {name!r} ignored")
    for option in OPTIONS:
        candidates: list[tuple[str, Any]] = []
        if overrides.get(option.name) is not None:
            candidates.append((f"argument {option.name}", overrides[option.name]))
        raw = env.get(option.env, "").strip()
        if raw:
            candidates.append((option.env, raw))
        values[option.name] = _first_valid(option, candidates, problems)[1]
    for name, kind in _EXPORT_OVERRIDES:
        if overrides.get(name) is not None:
            values[name] = kind(overrides[name])
    after, stall = values.get("abort_after_seconds"), values["stall_seconds"]
    if after is not None and after < stall:
        problems.append(f"{FR_OTEL_ABORT_AFTER_SECONDS}={after:g} is below the stall threshold ({stall:g} s): raised to "
                        "it (a rank never ends for a collective younger than a stall)")
        values["abort_after_seconds"] = stall
    return AgentConfig(**values), problems


def launch_environment(
    flags: Mapping[str, str], environ: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The ``FR_OTEL_*`` variables of a job ``fr-otel run`` launches, and one line per bad value.

    ``flags`` maps option names to the raw values given on the command line. Per option the
    first valid source (flag, then inherited variable) becomes the variable; an invalid one
    is reported here, once, and left out, so every rank quietly uses the next source or the
    default. Nothing is raised: fr-otel's settings never stop a job from starting.
    """
    env = dict(environ)
    problems: list[str] = []
    for option in OPTIONS:
        candidates: list[tuple[str, Any]] = []
        if flags.get(option.name) is not None:
            candidates.append((option.flag, flags[option.name]))
        raw = env.get(option.env, "").strip()
        if raw:
            candidates.append((option.env, raw))
        index, _ = _first_valid(option, candidates, problems)
        if index < 0:
            env.pop(option.env, None)
        else:
            env[option.env] = str(candidates[index][1]).strip()
    return env, problems
