"""PromQL pieces the dashboards share: the variable selectors and the "who is blamed" condition.

Every panel filters by the dashboard's variables in the same words; building the selector here
keeps them identical and lets a panel read as its metric and its aggregation.
"""

from __future__ import annotations

from collections.abc import Callable

from fr_otel.common.promql import GROUP_DESCRIPTION, GROUP_LABELS

JOB = 'job=~"$job"'
TRAINING_JOB = 'training_job=~"$training_job"'
PG = 'pg_name=~"$pg"'
RANK = 'rank="$rank"'
HOST = 'host=~"$host"'

#: The labels that identify a process group across jobs, and its description beside them (the
#: recording rules aggregate by the same; one home: fr_otel.common.promql).
GROUP = ", ".join((*GROUP_LABELS, GROUP_DESCRIPTION))


def selector(*matchers: str) -> Callable[[str], str]:
    """``metric`` -> ``metric{matchers}``: one dashboard's filter, applied the same way everywhere."""
    body = ", ".join(matchers)
    return lambda metric: f"{metric}{{{body}}}"


def blamed(pg: Callable[[str], str]) -> str:
    """Ranks behind their group (enqueued or completed lag) in a group that has waited at least
    the blame floor: the recording rules' notion of a rank the others wait for, per row."""
    lagging = (f"(({pg('rank_pg:fr_last_enqueued_seq:lag')} > 0) or "
               f"({pg('rank_pg:fr_last_completed_seq:lag')} > 0))")
    waited = f"({pg('pg:fr_inflight_collective_age_seconds:max')} >= on() group_left() threshold:fr_blame_floor:seconds)"
    return f"({lagging} and on({GROUP}) {waited})"
