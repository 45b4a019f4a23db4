"""The PromQL that names the rank the others wait for, from the agent's ``fr_*`` metrics.

One home for the query people run in Prometheus: the README prints it, ``fr-otel demo``
shows it beside the culprit it scraped, and the tests run it against a real Prometheus. It is
plain text over the metric names (the contract in :mod:`fr_otel.agent.metrics`), so it lives
below every application and imports nothing.
"""

from __future__ import annotations

from .stall import DEFAULT_STALL_S

__all__ = ["BLAME_RULE", "culprit_query"]

#: The recording rule in ``deploy/prometheus/fr-otel-rules.yml`` that keeps only the ends of the
#: wait chains (the ranks the others wait for, not the ones merely behind them); value: how many
#: collectives the rank is behind its group.
BLAME_RULE = "rank_pg:fr_behind:lag"


def culprit_query(threshold_s: float = DEFAULT_STALL_S, job_label: str = "job") -> str:
    """PromQL naming, per process group, the rank(s) the others wait for.

    The ranks whose last enqueued sequence number is the group's lowest, in groups whose
    members disagree, where some member's oldest collective has been in flight more than
    ``threshold_s``. ``job_label`` is the label that tells training jobs apart in your
    scrape config (group names restart at "0" in every job).
    """
    by = f"{job_label}, pg_name"
    return (
        f"(fr_last_enqueued_seq == on({by}) group_left() min by ({by}) (fr_last_enqueued_seq))"
        f" unless on({by}) (max by ({by}) (fr_last_enqueued_seq) == min by ({by}) (fr_last_enqueued_seq))"
        f" and on({by}) (max by ({by}) (fr_inflight_collective_age_seconds) > {threshold_s:g})"
    )
