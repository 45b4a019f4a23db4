"""fr-otel / Rank drill-down: one rank's groups, progress, age against its timeout, and its traces."""

from __future__ import annotations

from grafana_foundation_sdk.builders import stat as stat_builder
from grafana_foundation_sdk.models import dashboard as dm

from fr_otel.trace import attributes as A

from . import links
from .board import (
    Board,
    job_annotations,
    job_variables,
    query_variable,
    textbox_variable,
)
from .kit import (
    AGE_STEPS,
    ORANGE_FROM_ONE,
    RED_FROM_ONE,
    Columns,
    Panel,
    field,
    on_off,
    series,
    stat,
    table,
    timeseries,
    trace_search,
    trace_view,
    value_columns,
)
from .links import RANK_TITLE as TITLE
from .links import RANK_UID as UID
from .links import span, spanset
from .promql import GROUP, JOB, RANK, TRAINING_JOB, selector

job = selector(JOB, TRAINING_JOB)
rank = selector(JOB, TRAINING_JOB, RANK)
#: Per row of the rank's group table.
ROW = "job, training_job, instance, rank, pg_name, pg_desc"


def now() -> list[stat_builder.Panel]:
    """The stat row: is this rank stuck, near its timeout, holding others up, still watched."""
    return [
        stat("Oldest in-flight collective", f"max({rank('fr_inflight_collective_age_seconds')}) or vector(0)",
             unit="s", steps=AGE_STEPS),
        stat("Of its timeout",
             f"max({rank('rank_pg:fr_inflight_collective_age_seconds:timeout_ratio')}) or vector(0)",
             unit="percentunit", steps=(("green", None), ("yellow", 0.5), ("red", 0.8)),
             description="The oldest in-flight collective's age as a share of its own timeout; the watchdog fires "
                         "at 100 %."),
        stat("Groups waiting on it", f"count({rank('rank_pg:fr_behind:lag')}) or vector(0)", unit="none",
             steps=RED_FROM_ONE, decimals=0, description="Groups in which this rank is the one the others wait for."),
        stat("Incidents in range",
             f"round(sum(max by (job, training_job, rank) (increase({rank('fr_incidents_total')}[$__range])))) "
             "or vector(0)", unit="none", steps=ORANGE_FROM_ONE, decimals=0),
        stat("Flight Recorder", f"max({rank('fr_recorder_enabled')})", unit="none", mappings=[on_off()]),
        stat("Since last recorder poll", f"time() - max({rank('fr_agent_last_poll_timestamp_seconds')})", unit="s",
             steps=(("green", None), ("yellow", 30), ("red", 60))),
    ]


def groups_table() -> Panel:
    """Per group of the rank: sequence numbers, lags, oldest in-flight against its timeout."""
    sums = [f"sum by ({ROW}) ({rank(metric)})" for metric in
            ("fr_last_enqueued_seq", "fr_last_completed_seq", "rank_pg:fr_last_enqueued_seq:lag",
             "rank_pg:fr_last_completed_seq:lag")]
    maxima = [f"max by ({ROW}) ({rank(metric)})" for metric in
              ("fr_inflight_collective_age_seconds", "fr_inflight_collective_timeout_seconds")]
    headers = ["enqueued", "completed", "enqueued lag", "completed lag", "oldest in flight", "timeout"]
    values = value_columns(len(headers))
    return table(
        "Process groups of rank $rank", sums + maxima, unit="none",
        columns=Columns(order=["pg_name", "pg_desc", *values], rename=dict(zip(values, headers)),
                        hide=("job", "training_job", "instance", "rank")),
        sort="enqueued lag",
        fields=[field("oldest in flight", unit="s"), field("timeout", unit="s"),
                field("pg_name", links=[links.incidents_in_group()])],
        description="Per group: the last sequence numbers this rank enqueued and completed, how far behind the "
                    "group's most advanced member it is, and its oldest in-flight collective against that "
                    "collective's timeout.")


def build() -> Board:
    """The rank drill-down dashboard."""
    board = Board(UID, TITLE,
                  "One rank: its process groups, progress, in-flight age against the timeout, incidents and the "
                  "traces that name it.",
                  variables=[*job_variables(),
                             query_variable("rank", "Rank", f"label_values({job('fr_info')}, rank)", multi=False,
                                            sort=dm.VariableSort.NUMERICAL_ASC),
                             textbox_variable("trace_id", "Trace id")],
                  annotations=job_annotations())
    board.stat_row("Rank $rank now", *now())
    board.row(
        "Process groups",
        groups_table(),
        timeseries("In-flight age and timeout per group",
                   [(rank("fr_inflight_collective_age_seconds"), "{{pg_name}} {{op}} age"),
                    (f"{rank('fr_inflight_collective_timeout_seconds')} > 0", "{{pg_name}} timeout")],
                   unit="s", overrides=[series(".* timeout$", dashed=True)],
                   description="Age of this rank's oldest in-flight collective per group (label op: the collective) "
                               "and the timeout it runs under (dashed)."),
        timeseries("Progress per group",
                   [(rank("fr_last_enqueued_seq"), "{{pg_name}} enqueued"),
                    (rank("fr_last_completed_seq"), "{{pg_name}} completed"),
                    (f"{job('pg:fr_last_enqueued_seq:max')} and on({GROUP}) {rank('fr_last_enqueued_seq')}",
                     "{{pg_name}} group max enqueued")],
                   unit="none", soft_min=None,
                   description="This rank's last enqueued and completed sequence numbers against the most advanced "
                               "member of each group."),
        timeseries("Behind its group",
                   [(rank("rank_pg:fr_last_enqueued_seq:lag"), "{{pg_name}} enqueued lag"),
                    (rank("rank_pg:fr_last_completed_seq:lag"), "{{pg_name}} completed lag")],
                   unit="none",
                   description="Collectives this rank has not enqueued / completed yet that the group's most "
                               "advanced member has."),
        timeseries("Its wait against its group (exemplars open the trace)",
                   [(f"rate({rank('fr_collective_wait_seconds_total')}[$__rate_interval])", "{{pg_name}} its wait"),
                    (rank("rank_pg:fr_lateness:ratio"), "{{pg_name}} the group waits for it")],
                   unit="percentunit", exemplars=True,
                   description="The share of its time this rank spends waiting in each group's collectives, and its "
                               "lateness: the share of its time the group's typical member spends waiting for it "
                               "(FrOtelSlowRank fires at 10 %). Exemplars carry the latest incident's trace id "
                               "(a slow host's incident, when the agent raised one)."),
        timeseries("Incidents (exemplars open the trace)",
                   [(f"sum by (rank) (increase({rank('fr_incidents_total')}[$__rate_interval]))",
                     "incidents rank {{rank}}")],
                   unit="none", exemplars=True,
                   description="Incident traces exported by this rank; each carries a trace_id exemplar that opens "
                               "the trace."),
    )
    board.row(
        "Traces",
        trace_search("Incident traces that include rank $rank",
                     spanset(span(A.SPAN_ROLE, "=", '"rank"'), span(A.RANK, "=", "$rank")),
                     description="Tempo search on the span attribute contract (fr_otel.span = rank, "
                                 "pytorch.distributed.rank). Click a trace id to open it, or paste it into the "
                                 "trace_id variable."),
        trace_view("Trace ${trace_id}", "${trace_id}",
                   description="The trace whose id is in the trace_id variable (from an exemplar, the table above "
                               "or an alert)."),
    )
    board.row(
        "Agent",
        timeseries("Agent polls, errors and export failures",
                   [(f"rate({rank(f'fr_agent_{name}_total')}[$__rate_interval])", legend)
                    for name, legend in (("polls", "polls"), ("errors", "errors"),
                                         ("export_failures", "export failures"))],
                   unit="ops", overrides=[series("^(errors|export failures)$", color="red")]),
        table("Rank $rank", [rank("fr_info")], unit="none", w=12,
              columns=Columns(order=["rank", "local_rank", "host", "instance", "backend", "world_size",
                                     "torch_version", "recorder_capacity"], hide=("Value", "job")),
              description="fr_info: where the rank runs and with what."),
    )
    board.row(
        "Send/recv",
        timeseries("Pending send/recv of rank $rank, by peer",
                   [(f"max by ({GROUP}, op, peer) ({rank('fr_inflight_p2p_age_seconds')})",
                     "{{op}} peer {{peer}} on {{pg_desc}} ({{pg_name}})")],
                   unit="s", w=24,
                   description="Age of the rank's oldest pending send or recv to each peer (global rank; 'any' for "
                               "an any-source recv), known after the agent's full read of the recorder. A rising "
                               "line is a pipeline wait: follow the peer. Empty with gloo (it records no "
                               "send/recv)."),
    )
    return board
