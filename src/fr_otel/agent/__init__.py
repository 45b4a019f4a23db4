"""The live agent: Flight Recorder progress as Prometheus metrics, hangs as one trace, in-process.

Usage, one line anywhere in the training script (before or after ``init_process_group``;
calling it again returns the running agent)::

    import fr_otel
    fr_otel.start()                       # or fr_otel.start(stall_seconds=120, metrics_port=9740)

or with no code change at all::

    fr-otel run --stall-seconds 120 -- torchrun --nproc-per-node 8 train.py

Each rank then serves ``/metrics`` on ``9740 + LOCAL_RANK`` (the ``fr_*`` series:
in-flight age and timeout per group, last enqueued/completed sequence numbers, incidents,
agent health); when a collective has been in flight longer than min(``stall_seconds``,
half its timeout), the rank that sees it raises an incident through the job's own store,
every rank writes its recorder to ``fr-otel-out/dumps/<trace id>/fr_trace_rank_<rank>``,
and the raiser exports one OpenTelemetry trace with the verdict as its root (standard
``OTEL_EXPORTER_OTLP_*`` configuration; without an endpoint, an OTLP JSON file). The same
happens, bounded, on an uncaught exception or SIGTERM.

Settings: arguments > ``FR_OTEL_*`` variables > defaults (:mod:`fr_otel.agent.config`).
Nothing here raises into the training script: failures are counted
(``fr_agent_errors_total``) and logged to stderr, rarely. See ``docs/agent.md``.
"""

from .config import AgentConfig
from .lifecycle import current, flush, start, stop

__all__ = ["AgentConfig", "current", "flush", "start", "stop"]
