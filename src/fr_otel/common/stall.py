"""When an op in flight counts as stalled, for every part that says so.

A job whose pace is unknown stalls after :data:`DEFAULT_STALL_S`: the live agent's default
``stall_seconds`` (when it raises an incident), the analysis' (:mod:`fr_otel.diagnosis.pace`,
which lowers it to a multiple of the job's own pace when the dumps show one), the culprit query
people run in Prometheus (:mod:`.promql`) and the alert rules' ``threshold:fr_collective_stalled:seconds``
(``deploy/prometheus/fr-otel-rules.yml``; a test holds them equal). It lives here, below every
layer, because the agent, the analysis and the PromQL text all need it and none may import another.
"""

from __future__ import annotations

__all__ = ["DEFAULT_STALL_S"]

#: In flight this long is a stall when the job's pace is unknown.
DEFAULT_STALL_S = 60.0
