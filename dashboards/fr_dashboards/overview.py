"""fr-otel / Overview: the fleet view. What is stuck, which ranks the others wait for, the traces."""

from __future__ import annotations

from grafana_foundation_sdk.builders import stat as stat_builder

from fr_otel.common.promql import BLAME_FLOOR_S
from fr_otel.common.stall import DEFAULT_STALL_S

from . import links
from .board import Board, job_annotations, job_variables, query_variable
from .kit import (
    AGE_STEPS,
    ORANGE_FROM_ONE,
    RED_FROM_ONE,
    Columns,
    Panel,
    field,
    heatmap,
    series,
    stat,
    table,
    timeseries,
    yes_between,
)
from .promql import GROUP, JOB, PG, TRAINING_JOB, blamed, selector

UID = "fr-otel-overview"
job = selector(JOB, TRAINING_JOB)
pg = selector(JOB, TRAINING_JOB, PG)
#: Per row of a rank x group table.
ROW = "job, training_job, instance, rank, pg_name, pg_desc"
GROUP_LEGEND = "{{pg_name}} {{pg_desc}} {{training_job}}"


def now() -> list[stat_builder.Panel]:
    """The stat row: the six numbers to read first."""
    return [
        stat("Oldest in-flight collective",
             f"max({pg('pg:fr_inflight_collective_age_seconds:max')}) or vector(0)", unit="s",
             steps=AGE_STEPS,
             description="Age of the oldest collective any rank has enqueued and not completed, over the selected "
                         "groups. Computed at scrape time, so it keeps growing while a job hangs."),
        stat("Ranks behind",
             f"count(count by (job, training_job, rank) ({pg('rank_pg:fr_behind:lag')})) or vector(0)",
             unit="none", steps=RED_FROM_ONE, decimals=0,
             description="Ranks whose last enqueued collective is the lowest of a group that has waited at least "
                         f"the blame floor (threshold:fr_blame_floor:seconds, {BLAME_FLOOR_S:g} s as shipped): the "
                         "ranks the others wait for (recording rule rank_pg:fr_behind:lag). Behind is not stalled: "
                         "a group stalls at threshold:fr_collective_stalled:seconds."),
        stat("Groups stalled",
             f"count({pg('pg:fr_inflight_collective_age_seconds:max')} > pg:fr_stall_threshold:seconds) "
             "or vector(0)",
             unit="none", steps=RED_FROM_ONE, decimals=0,
             description="Process groups whose oldest in-flight collective is stalled: older than their job's "
                         "stall threshold (pg:fr_stall_threshold:seconds: what its agents export, their "
                         f"--stall-seconds, else threshold:fr_collective_stalled:seconds, {DEFAULT_STALL_S:g} s)."),
        stat("Incidents in range",
             f"round(sum(max by (job, training_job) (increase({job('fr_incidents_total')}[$__range])))) "
             "or vector(0)",
             unit="none", steps=ORANGE_FROM_ONE, decimals=0,
             description="Incidents in the dashboard's time range, each counted once per job: every rank that "
                         "takes part counts it in fr_incidents_total, so this is the max over a job's ranks, not "
                         "their sum."),
        stat("Agents up", f"sum({job('up')}) or vector(0)", unit="none", decimals=0,
             description="fr-otel agent targets Prometheus scrapes successfully (one per rank)."),
        stat("Ranks with recorder off", f"count({job('fr_recorder_enabled')} == 0) or vector(0)",
             unit="none", steps=ORANGE_FROM_ONE, decimals=0,
             description="Ranks running without a Flight Recorder: a hang there cannot be diagnosed."),
    ]


def who_is_behind() -> Panel:
    """The culprit table: per rank and group, its lags, how long the group has waited, and
    whether it is the rank the group waits for; links to its traces and drill-down."""
    who = blamed(pg)
    return table(
        "Who is behind",
        [f"sum by ({ROW}) ({pg('rank_pg:fr_last_enqueued_seq:lag')} and {who})",
         f"sum by ({ROW}) ({pg('rank_pg:fr_last_completed_seq:lag')} and {who})",
         (f"sum by ({ROW}) ({pg('pg:fr_inflight_collective_age_seconds:max')} + on({GROUP}) group_right() "
          f"(0 * {who}))"),
         f"sum by ({ROW}) ({pg('rank_pg:fr_behind:lag')})"],
        unit="none", h=10,
        columns=Columns(order=["rank", "training_job", "pg_name", "pg_desc", "Value #A", "Value #B", "Value #C",
                               "Value #D", "instance"],
                        rename={"Value #A": "enqueued lag", "Value #B": "completed lag", "Value #C": "group waiting",
                                "Value #D": "waited for"}),
        sort="enqueued lag",
        fields=[field("rank", links=links.rank_links()),
                field("pg_name", links=[links.incidents_in_group()]),
                field("group waiting", unit="s"),
                field("waited for", mappings=[yes_between(1, 1e12)], background=True)],
        links=[links.all_incidents()],
        description="Ranks behind the most advanced member of a group that has waited at least the blame floor "
                    f"(threshold:fr_blame_floor:seconds, {BLAME_FLOOR_S:g} s as shipped). 'enqueued lag' counts "
                    "collectives the rank has not issued yet (CPU side: data loader, other code path); 'completed "
                    "lag' collectives it issued and did not finish (device or network). 'waited for' marks the "
                    "rank(s) the group waits on (lowest enqueued). Click a rank for its incident traces or its "
                    "drill-down.")


def lost_hosts() -> Panel:
    """The ranks whose agents stopped answering, one row each, with their host (from the last
    fr_info each served) and whether FrOtelNodeLost names that host: the alert's own verdict, so
    the table and the alert never disagree (a crashed host is lost, its survivors only silent)."""
    row = "job, training_job, host, rank, instance"
    down = f"({job('rank:fr_agent_up:last_info')} == 0)"
    per_host = "on(job, training_job, host) group_left()"
    named = 'max by (job, training_job, host) (ALERTS{alertname="FrOtelNodeLost", alertstate="firing"})'
    return table(
        "Lost ranks and hosts",
        [f"max by ({row}) ({down} + {per_host} host:fr_agents_down:ratio)",
         f"max by ({row}) (({down} + {per_host} {named}) or {down})",
         (f"max by ({row}) (time() - {job('rank:fr_agent_heard:last_timestamp')} "
          f"and on(job, training_job, instance) {down})")],
        unit="none",
        columns=Columns(order=["host", "rank", "training_job", "Value #A", "Value #B", "Value #C", "instance"],
                        rename={"Value #A": "host's ranks down", "Value #B": "host lost",
                                "Value #C": "silent for"}),
        sort="host's ranks down",
        fields=[field("rank", links=links.rank_links()), field("host's ranks down", unit="percentunit"),
                field("host lost", mappings=[yes_between(1, 1)], background=True),
                field("silent for", unit="s")],
        links=[links.all_incidents()],
        description="Ranks whose fr-otel agent Prometheus can no longer scrape, each with the host its last fr_info "
                    "named (remembered for an hour), the share of that host's ranks that are down, and how long it "
                    "has been silent. 'host lost' marks the hosts FrOtelNodeLost names (firing): down, cut off or "
                    "frozen while another host of the job answers, or silent well before the rest of the job, "
                    "which then ended (a crash). After a crash every rank is silent, and only the host that went "
                    "first is lost. Empty while every agent answers.")


def build() -> Board:
    """The overview dashboard."""
    board = Board(UID, "fr-otel / Overview",
                  "Fleet view of collective progress from PyTorch Flight Recorder: what is stuck, which ranks the "
                  "others wait for, and the incident traces.",
                  variables=[*job_variables(),
                             query_variable("pg", "Process group",
                                            f"label_values({job('fr_last_enqueued_seq')}, pg_name)")],
                  annotations=job_annotations())
    board.stat_row("Now", *now())
    board.row(
        "Process groups",
        timeseries("Oldest in-flight collective per group",
                   [(pg("pg:fr_inflight_collective_age_seconds:max"), GROUP_LEGEND)], unit="s",
                   threshold=DEFAULT_STALL_S,
                   description="Per process group, the age of its oldest in-flight collective (0 when none). The "
                               "dashed line is where it counts as stalled (threshold:fr_collective_stalled:seconds, "
                               f"{DEFAULT_STALL_S:g} s as shipped)."),
        timeseries("Ranks behind, per group", [(f"count by ({GROUP}) ({pg('rank_pg:fr_behind:lag')})", GROUP_LEGEND)],
                   unit="none", description="How many ranks each waiting group is waiting for."),
    )
    board.row(
        "Ranks",
        heatmap("In-flight collective age by rank",
                (f"max by (rank) ({pg('fr_inflight_collective_age_seconds')})", "{{rank}}"), unit="s", y_label="rank",
                description="Rank x time; colour is the age of the rank's oldest in-flight collective. A hang shows "
                            "as the waiting ranks heating up while the rank they wait for stays cold."),
        who_is_behind(),
    )
    board.row("Hosts", lost_hosts())
    board.row(
        "Progress and agents",
        timeseries("Enqueued progress per group (max and min over ranks)",
                   [(pg("pg:fr_last_enqueued_seq:max"), "max {{pg_name}} {{pg_desc}}"),
                    (pg("pg:fr_last_enqueued_seq:min"), "min {{pg_name}} {{pg_desc}}")],
                   unit="none", soft_min=None,
                   description="Highest and lowest last-enqueued sequence number per group: a gap that stops "
                               "closing is a hang."),
        timeseries("Agent polls, errors and export failures",
                   [(f"sum by (job, training_job) (rate({job(f'fr_agent_{name}_total')}[$__rate_interval]))",
                     f"{legend} {{{{training_job}}}}")
                    for name, legend in (("polls", "polls"), ("errors", "errors"),
                                         ("export_failures", "export failures"))],
                   unit="ops", overrides=[series("^(errors|export failures).*", color="red")],
                   description="Recorder polls per second over all ranks, and the agent's own errors and failed "
                               "OTLP exports."),
        timeseries("Incidents (exemplars open the trace)",
                   [(f"max by (job, training_job) (increase({job('fr_incidents_total')}[$__rate_interval]))",
                     "incidents {{training_job}}")],
                   unit="none", exemplars=True, w=24, h=7,
                   description="Incident traces exported. Each increment carries a trace_id exemplar: hover a dot "
                               "and follow 'Open incident trace' (Prometheus needs "
                               "--enable-feature=exemplar-storage)."),
    )
    board.row(
        "Slow ranks (no hang): who everyone waits for",
        timeseries("Who everyone waits for, per group",
                   [(f"{pg('rank_pg:fr_lateness:ratio')} > 0", "rank {{rank}} " + GROUP_LEGEND)],
                   unit="percentunit", threshold=0.1,
                   description="Each rank's lateness (rank_pg:fr_lateness:ratio): the share of its time its group's "
                               "typical member spends waiting for it in the group's collectives (the group's median "
                               "wait minus its own). The rank everyone waits for is on top; ranks that merely wait "
                               "are below 0 and not drawn. The dashed line is the FrOtelSlowRank threshold "
                               "(threshold:fr_slow_rank_lateness:ratio, 10 %)."),
        timeseries("Time waiting in collectives, per rank",
                   [(pg("rank_pg:fr_collective_wait:ratio"), "rank {{rank}} " + GROUP_LEGEND),
                    (pg("pg:fr_collective_wait_ratio:median"), "median " + GROUP_LEGEND)],
                   unit="percentunit", overrides=[series("^median .*", dashed=True)],
                   description="The share of its time each rank spends waiting in each group's collectives "
                               "(fr_collective_wait_seconds_total, sampled by the agent), and the group's median "
                               "(dashed). A slow rank waits least: it arrives last."),
    )
    per_rank = "job, training_job, instance, rank"
    board.row(
        "Training steps",
        timeseries("Training step per rank",
                   [(f"max by (job, training_job, rank) ({job('fr_training_step')})", "rank {{rank}}")],
                   unit="none", soft_min=None, legend_calcs=["lastNotNull"],
                   description="The training step each rank is in (the agent counts optimizer steps, or "
                               "fr_otel.step(n)). In a hang every line goes flat; a rank below the others stopped a "
                               "step earlier."),
        table("Where the steps stopped",
              [f"sort_desc(max by ({per_rank}) ({job('fr_training_step_age_seconds')}))",
               f"max by ({per_rank}) ({job('fr_training_step')})",
               f"max by ({per_rank}) ({job('rank:fr_training_step:lag')})"],
              unit="none", w=12,
              columns=Columns(order=["rank", "training_job", "Value #B", "Value #A", "Value #C", "instance"],
                              rename={"Value #A": "in its step for", "Value #B": "step", "Value #C": "steps behind"}),
              sort="in its step for",
              fields=[field("rank", links=links.rank_links()), field("in its step for", unit="s")],
              links=[links.all_incidents()],
              description="Per rank: the step it is in, how long it has been in it, and how many steps it is behind "
                          "the job's most advanced rank. The rank longest in its step (top) or behind the others is "
                          "where training stopped."),
    )
    per_peer = "job, training_job, peer, pg_name, pg_desc"
    board.row(
        "Send/recv (pipeline parallelism)",
        table("Waited on in send/recv",
              [f"sum by ({per_peer}) ({pg('peer_pg:fr_inflight_p2p_age_seconds:max')})",
               f"sum by ({per_peer}) ({pg('peer_pg:fr_p2p_waited_on:age_seconds')} > bool 0)"],
              unit="s",
              columns=Columns(order=["peer", "training_job", "pg_name", "pg_desc", "Value #A", "Value #B"],
                              rename={"peer": "rank waited on", "Value #A": "longest wait",
                                      "Value #B": "end of chain"}),
              sort="longest wait",
              fields=[field("end of chain", unit="none", mappings=[yes_between(1, 1)], background=True),
                      field("rank waited on", unit="none",
                            links=[links.rank_drilldown('${__data.fields["rank waited on"]}')])],
              description="Ranks that others wait on in send/recv, per group ('longest wait': the oldest pending "
                          "send or recv to that peer). 'end of chain' marks a peer that is not itself waiting in a "
                          "send/recv: the rank a pipeline stall comes from (FrOtelSendRecvStalled). Per-rank p2p "
                          "counters are never compared across ranks; gloo records no send/recv, so this stays empty "
                          "there."),
    )
    return board
