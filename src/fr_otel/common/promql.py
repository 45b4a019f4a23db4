"""The PromQL that names the rank the others wait for, from the agent's ``fr_*`` metrics.

One home for the query people run in Prometheus: the README prints it, ``fr-otel demo``
shows it beside the culprit it scraped, and the tests run it against a real Prometheus. It is
plain text over the metric names (the contract in :mod:`fr_otel.agent.serve.metrics`), so it lives
below every application and imports nothing.

Also the one home of what identifies a process group in PromQL (:data:`GROUP_LABELS`): the
recording rules in ``deploy/prometheus/fr-otel-rules.yml`` aggregate and join on the same
labels (a test reads every ``by``/``on`` there) and the dashboards build theirs from it.
"""

from __future__ import annotations

from .stall import DEFAULT_STALL_S

__all__ = ["BLAME_FLOOR_S", "BLAME_RULE", "GROUP_DESCRIPTION", "GROUP_LABELS", "culprit_query"]

#: What tells one process group from another across the jobs one Prometheus scrapes: the scrape
#: job, the optional ``training_job`` target label (empty when unset, which still matches) and
#: the group's recorded name. A name alone is not enough: group names restart at "0" in every job.
GROUP_LABELS: tuple[str, ...] = ("job", "training_job", "pg_name")

#: Carried beside :data:`GROUP_LABELS` wherever a group is aggregated, so that tables and alerts
#: can show it: the group's description (``pg_desc``), fixed by its name, never part of its identity.
GROUP_DESCRIPTION = "pg_desc"

#: The recording rule in ``deploy/prometheus/fr-otel-rules.yml`` that keeps only the ends of the
#: wait chains (the ranks the others wait for, not the ones merely behind them); value: how many
#: collectives the rank is behind its group.
BLAME_RULE = "rank_pg:fr_behind:lag"

#: The rules' ``threshold:fr_blame_floor:seconds`` (a test holds them equal): a rank counts as
#: *behind* only once its group's oldest in-flight collective is this old; younger, a seq or two
#: of lag is ordinary skew between ranks. Not a stall: that is :data:`DEFAULT_STALL_S`.
BLAME_FLOOR_S = 10.0


def _group_labels(job_label: str = "job") -> tuple[str, ...]:
    """:data:`GROUP_LABELS` with ``job`` replaced by ``job_label``: the label (or labels,
    comma-separated) that tells training jobs apart in your scrape config. No label twice."""
    wanted = [label.strip() for label in job_label.split(",") if label.strip()]
    out: list[str] = []
    for label in GROUP_LABELS:
        for name in wanted if label == "job" else [label]:
            if name not in out:
                out.append(name)
    return tuple(out)


def culprit_query(threshold_s: float = DEFAULT_STALL_S, job_label: str = "job") -> str:
    """PromQL naming, per process group, the rank(s) the others wait for.

    The ranks whose last enqueued sequence number is the group's lowest, in groups whose
    members disagree, where some member's oldest collective has been in flight more than
    ``threshold_s`` (stalled, as the agent and the alert rules mean it). Groups are told apart
    by :data:`GROUP_LABELS`, ``job`` replaced by ``job_label``.
    """
    by = ", ".join(_group_labels(job_label))
    return (
        f"(fr_last_enqueued_seq == on({by}) group_left() min by ({by}) (fr_last_enqueued_seq))"
        f" unless on({by}) (max by ({by}) (fr_last_enqueued_seq) == min by ({by}) (fr_last_enqueued_seq))"
        f" and on({by}) (max by ({by}) (fr_inflight_collective_age_seconds) > {threshold_s:g})"
    )
