"""The culprit query people run in Prometheus: the group identity the rules use, and the text the docs print."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.rules import groupings

from fr_otel.common.promql import GROUP_LABELS, culprit_query
from fr_otel.common.stall import DEFAULT_STALL_S

REPO = Path(__file__).resolve().parents[2]

def test_the_culprit_query_tells_groups_apart_by_the_group_labels() -> None:
    """Every by/on of the query is GROUP_LABELS (job, training_job, pg_name), as in the rules: two
    training jobs' group "0" are never compared with each other."""
    assert GROUP_LABELS == ("job", "training_job", "pg_name")
    clauses = groupings(culprit_query())
    assert len(clauses) == 7 and set(clauses) == {GROUP_LABELS}


def test_the_culprit_query_calls_stalled_what_the_product_does() -> None:
    """By default a group counts once its oldest collective is older than DEFAULT_STALL_S; a
    threshold given is printed as given."""
    assert culprit_query().endswith(f"(fr_inflight_collective_age_seconds) > {DEFAULT_STALL_S:g})")
    assert culprit_query(2.5).endswith("(fr_inflight_collective_age_seconds) > 2.5)")


@pytest.mark.parametrize(("job_label", "expected"), [
    ("job", ("job", "training_job", "pg_name")),
    ("cluster_job", ("cluster_job", "training_job", "pg_name")),
    ("job, slurm_job_id", ("job", "slurm_job_id", "training_job", "pg_name")),
    ("training_job", ("training_job", "pg_name")),
])
def test_the_job_label_replaces_or_adds_to_job_and_names_no_label_twice(
        job_label: str, expected: tuple[str, ...]) -> None:
    """job_label stands in for ``job`` (one label, or several comma-separated); the other group labels stay."""
    assert set(groupings(culprit_query(job_label=job_label))) == {expected}


@pytest.mark.parametrize("doc", ["README.md", "docs/agent.md"])
def test_the_docs_print_the_query_culprit_query_returns(doc: str) -> None:
    """The culprit query a doc prints (a promql block starting with fr_last_enqueued_seq ==) is
    culprit_query() with its defaults, line breaks aside."""
    text = (REPO / doc).read_text(encoding="utf-8")
    blocks = [" ".join(b.split("\n")).strip() for b in re.findall(r"```promql\n(.*?)```", text, re.DOTALL)]
    printed = [b for b in blocks if b.startswith("(fr_last_enqueued_seq ==")]
    assert printed == [culprit_query()]
