"""fr-otel / Infra correlation: ranks beside their GPU (DCGM), host (node exporter) and NIC/InfiniBand.

Joins go through ``host``: ``fr_info{host}`` for ranks, the recording rules' ``host_gpu:*`` for
DCGM (either side of its 4.9 renames), ``node_uname_info{nodename}`` for node-exporter series.
"On the culprit's host" reads the rules' ``host:*`` signals (the last 15 minutes, per host) for
the hosts the culprit alerts name (``host:fr_culprit:info``), as FrOtelCulpritHostFault does.
"""

from __future__ import annotations

from fr_otel.common.stall import DEFAULT_STALL_S

from . import links
from .board import Board, annotation, job_annotations, job_variables, query_variable
from .kit import RED_FROM_ONE, Columns, Panel, field, table, timeseries, value_columns, yes_between
from .promql import HOST, JOB, TRAINING_JOB, selector

UID = "fr-otel-infra"
job = selector(JOB, TRAINING_JOB)
#: The ranks of the selected jobs on the selected hosts.
ranks_on = selector(JOB, TRAINING_JOB, HOST)
hosts = selector(HOST)
GPU_LEGEND = "{{host}} GPU {{gpu}}"
#: Interfaces that never carry collective traffic.
VIRTUAL_NICS = 'device!~"lo|veth.*|docker.*|br-.*|cali.*|flannel.*|cni.*|virbr.*"'


def on_rank_hosts(aggregation: str, series: str) -> str:
    """A node-exporter ``series`` under ``aggregation``, labelled with its host (node_uname_info's
    nodename), kept only for hosts that run ranks of the selected jobs."""
    return (f'{aggregation} (label_replace({series} * on(instance) group_left(nodename) node_uname_info, '
            f'"host", "$1", "nodename", "(.*)")) and on(host) {ranks_on("fr_info")}')


def ranks_table() -> Panel:
    """Every rank with its GPU and that GPU's state, worst lag first."""
    with_gpu = f"on(job, training_job, instance) group_left(host, gpu) {ranks_on('rank:fr_host_gpu:info')}"
    gpu_state = ["host_gpu:dcgm_xid_error:last", "host_gpu:dcgm_gpu_utilization:ratio",
                 "host_gpu:dcgm_gpu_temperature:celsius", "host_gpu:dcgm_power_usage:watts"]
    exprs = [f"max by (rank, host, gpu) ({job(metric)} * {with_gpu})"
             for metric in ("rank_pg:fr_last_enqueued_seq:lag", "fr_inflight_collective_age_seconds")]
    exprs += [f"max by (rank, host, gpu) ({ranks_on('rank:fr_host_gpu:info')} * on(host, gpu) group_left() {metric})"
              for metric in gpu_state]
    headers = ["enqueued lag", "oldest in flight", "last XID", "GPU util", "GPU temp", "GPU power"]
    values = value_columns(len(headers))
    return table(
        "Ranks, their GPU and what it says", exprs, unit="none", h=10,
        columns=Columns(order=["rank", "host", "gpu", *values], rename=dict(zip(values, headers)), hide=()),
        sort="enqueued lag",
        fields=[field("rank", links=[links.rank_drilldown()]), field("oldest in flight", unit="s"),
                field("GPU util", unit="percentunit"), field("GPU temp", unit="celsius"),
                field("GPU power", unit="watt"), field("last XID", thresholds=RED_FROM_ONE, background=True)],
        description="Every rank on the selected hosts with its GPU (local rank i -> GPU i) and that GPU's DCGM "
                    "state: 'rank 12 stalled' beside 'GPU 3 on node-07 raised XID 79'. Sorted by how far the rank "
                    "is behind.")


#: The host-level signals of the recording rules, as FrOtelCulpritHostFault reads them: (rule, column
#: and panel title, description).
CULPRIT_HOST_SIGNALS = [
    ("host:dcgm_xid_error:max", "last XID",
     "The highest last XID of the host's GPUs over the last 15 minutes (DCGM holds the last code, 0 = none). "
     "79: fell off the bus; 48/63/64/94/95: memory errors; 74: NVLink; 13/31/43: application faults."),
    ("host:dcgm_row_remap_failure:max", "row remap failure",
     "1 when a GPU of the host failed to remap a memory row in the last 15 minutes: its memory is failing."),
    ("host:dcgm_nvlink_errors:increase", "NVLink errors",
     "NVLink CRC, replay and recovery errors of the host's GPUs in the last 15 minutes (DCGM exporter ships "
     "these counters commented out: empty until they are enabled)."),
    ("host:node_oom_kills:increase", "OOM kills",
     "Processes the kernel's OOM killer killed on the host in the last 15 minutes (node_vmstat_oom_kill)."),
    ("host:node_network_errors:increase", "NIC errors",
     "Receive and transmit errors of the host's NICs (virtual interfaces left out) in the last 15 minutes."),
]


def culprit_host_panels() -> list[Panel]:
    """The hosts the culprit alerts name, beside what their GPUs and kernel reported."""
    culprits = ranks_on("host:fr_culprit:info")
    headers = ["jobs held up", *(header for _, header, _ in CULPRIT_HOST_SIGNALS)]
    values = value_columns(len(headers))
    exprs = [f"count by (host) ({culprits})"]
    exprs += [f"max by (host) ({culprits} * on(host) group_left() {rule})" for rule, _, _ in CULPRIT_HOST_SIGNALS]
    counts = [field(header, thresholds=RED_FROM_ONE, background=True) for header in headers[1:]
              if header != "row remap failure"]
    overview = table(
        "Culprit hosts and what their hardware says", exprs, unit="none", h=6,
        columns=Columns(order=["host", *values], rename=dict(zip(values, headers)), hide=()),
        sort="jobs held up",
        fields=[*counts, field("row remap failure", mappings=[yes_between(1, 1)], background=True)],
        description="The hosts fr-otel's culprit alerts name for the selected jobs (FrOtelRankLagging and "
                    "FrOtelSendRecvStalled through their ranks' fr_info host, FrOtelSlowRank, FrOtelSlowHost, "
                    "FrOtelNodeLost, FrOtelExcludeHost: host:fr_culprit:info), each with what DCGM and node exporter "
                    "reported on it over the last 15 minutes. A red cell is a likely cause, not only a culprit: "
                    "FrOtelCulpritHostFault fires for it. Empty while no culprit alert fires.")
    on_culprits = f"and on(host) {culprits}"
    panels: list[Panel] = [overview, timeseries(
        "Last XID per GPU on the culprit's host",
        [(f"{hosts('host_gpu:dcgm_xid_error:last')} > 0 {on_culprits}", GPU_LEGEND)], unit="none", w=8,
        description="The last XID each GPU of a culprit's host reported, while the host is a culprit.")]
    # Three to a line, then two: the XID panel, row remaps and NVLink; OOM kills and NICs.
    for (rule, header, description), w in zip(CULPRIT_HOST_SIGNALS[1:], (8, 8, 12, 12), strict=True):
        title = f"{header[0].upper()}{header[1:]} on the culprit's host"
        panels.append(timeseries(title, [(f"{rule} {on_culprits}", "{{host}}")], unit="none", w=w,
                                 description=description))
    return panels


def gpu_panels() -> list[Panel]:
    """DCGM, read through the recording rules that accept both metric generations."""
    def gpu(title: str, metric: str, unit: str, description: str = "", w: int = 8) -> Panel:
        return timeseries(title, [(metric, GPU_LEGEND)], unit=unit, description=description, w=w)

    pcie = ('sum by (host, gpu) (label_replace(label_replace(label_replace('
            'rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[$__rate_interval]) or '
            'rate(DCGM_FI_DEV_PCIE_REPLAY_TOTAL[$__rate_interval]), "host", "$1", "instance", "([^:]+).*"), '
            '"host", "$1", "Hostname", "(.+)"), "host", "$1", "hostname", "(.+)")) '
            f'and on(host) {ranks_on("fr_info")}')
    return [
        gpu("Last XID per GPU", f"{hosts('host_gpu:dcgm_xid_error:last')} > 0", "none",
            "The last XID code the driver reported for each GPU (0 = none). 79: fell off the bus; 48/63/64/94/95: "
            "memory errors; 74: NVLink; 13/31/43: application faults. See docs/runbook.md."),
        gpu("GPU utilization", hosts("host_gpu:dcgm_gpu_utilization:ratio"), "percentunit"),
        gpu("GPU power", hosts("host_gpu:dcgm_power_usage:watts"), "watt"),
        gpu("GPU temperature", hosts("host_gpu:dcgm_gpu_temperature:celsius"), "celsius"),
        gpu("NVLink throughput", hosts("host_gpu:dcgm_nvlink_throughput:bytes_per_second"), "Bps"),
        gpu("PCIe replays", pcie, "cps",
            "PCIe link retries per second (DCGM_FI_DEV_PCIE_REPLAY_COUNTER before 4.9, "
            "DCGM_FI_DEV_PCIE_REPLAY_TOTAL after)."),
        gpu("GPU memory used", hosts("host_gpu:dcgm_fb_used:bytes"), "bytes", w=12),
        gpu("SM clock", hosts("host_gpu:dcgm_sm_clock:hertz"), "hertz",
            "A clock that drops under load is throttling (power, thermal).", w=12),
    ]


def network_panels() -> list[Panel]:
    """NIC (virtual interfaces left out) and InfiniBand, per host and device."""
    def nic(direction: str, counter: str) -> str:
        return on_rank_hosts("sum by (host, device)",
                             f"rate(node_network_{direction}_{counter}_total{{{VIRTUAL_NICS}}}[$__rate_interval])")

    def ib(counter: str) -> str:
        return on_rank_hosts("sum by (host, device, port)", f"rate(node_infiniband_{counter}[$__rate_interval])")

    port = "{{host}} {{device}}:{{port}}"
    return [
        timeseries("NIC throughput", [(nic("receive", "bytes"), "{{host}} {{device}} rx"),
                                      (nic("transmit", "bytes"), "{{host}} {{device}} tx")], unit="Bps"),
        timeseries("NIC errors and drops", [(nic("receive", "errs"), "{{host}} {{device}} rx errors"),
                                            (nic("transmit", "errs"), "{{host}} {{device}} tx errors"),
                                            (nic("receive", "drop"), "{{host}} {{device}} rx drops"),
                                            (nic("transmit", "drop"), "{{host}} {{device}} tx drops")], unit="pps"),
        timeseries("InfiniBand throughput", [(ib("port_data_received_bytes_total"), f"{port} rx"),
                                             (ib("port_data_transmitted_bytes_total"), f"{port} tx")], unit="Bps"),
        timeseries("InfiniBand errors, link downs and transmit waits",
                   [(ib("port_errors_received_total"), f"{port} rx errors"),
                    (ib("link_downed_total"), f"{port} link downs"),
                    (ib("port_transmit_wait_total"), f"{port} xmit wait ticks")], unit="cps",
                   description="Errors and link downs point at cabling or the switch; transmit waits at congestion."),
    ]


def build() -> Board:
    """The infra correlation dashboard."""
    xid = annotation("XID", f"changes({hosts('host_gpu:dcgm_xid_error:last')}[$__rate_interval]) > 0",
                     color="purple", title="XID on {{host}} GPU {{gpu}}", tags="host,gpu",
                     text="the GPU's last XID changed")
    board = Board(UID, "fr-otel / Infra correlation",
                  "Collective progress beside GPU (DCGM exporter, before and after its 4.9 renames), host (node "
                  "exporter) and NIC/InfiniBand telemetry, joined by host via fr_info{host}.",
                  variables=[*job_variables(),
                             query_variable("host", "Host", f"label_values({job('fr_info')}, host)")],
                  annotations=[*job_annotations(), xid])
    board.row("Ranks beside their hardware", ranks_table())
    board.row("On the culprit's host", *culprit_host_panels())
    per_host = "on(job, training_job, instance) group_left(host)"
    board.row(
        "Communication",
        timeseries("Oldest in-flight collective per host",
                   [((f"max by (host) ({job('fr_inflight_collective_age_seconds')} * {per_host} "
                      f"{ranks_on('fr_info')})"), "{{host}}")], unit="s", threshold=DEFAULT_STALL_S),
        timeseries("Ranks the others wait for, per host",
                   [((f"count by (host) (count by (job, training_job, rank, host) ({job('rank_pg:fr_behind:lag')} "
                      f"* {per_host} {ranks_on('fr_info')}))"), "{{host}}")], unit="none"),
        timeseries("Who everyone waits for, per host",
                   [(ranks_on("host_pg:fr_lateness:ratio"), "{{host}} {{pg_desc}} ({{pg_name}}) {{training_job}}")],
                   unit="percentunit", threshold=0.1, w=24,
                   description="Per host and group, the least late of its ranks (host_pg:fr_lateness:ratio): the "
                               "share of its time the group's typical member spends waiting for every rank of that "
                               "host. A host above the dashed line (the FrOtelSlowHost threshold, "
                               "threshold:fr_slow_rank_lateness:ratio, 10 %) runs the whole job at its pace: look at "
                               "its CPU, GPU clocks and NICs below."),
    )
    board.row("GPU (DCGM exporter, names before and after 4.9)", *gpu_panels())
    board.row(
        "Host (node exporter)",
        timeseries("CPU busy",
                   [(on_rank_hosts("1 - avg by (host)",
                                   'rate(node_cpu_seconds_total{mode="idle"}[$__rate_interval])'), "{{host}}")],
                   unit="percentunit", w=8,
                   description="A rank that never enqueues is often CPU-bound elsewhere (data loader, GIL): look for "
                               "a host at 100 %."),
        timeseries("Memory available", [(on_rank_hosts("sum by (host)", "node_memory_MemAvailable_bytes"), "{{host}}")],
                   unit="bytes", w=8),
        timeseries("Load (1 m)", [(on_rank_hosts("sum by (host)", "node_load1"), "{{host}}")], unit="none", w=8),
    )
    board.row("Network (NIC and InfiniBand)", *network_panels())
    return board
