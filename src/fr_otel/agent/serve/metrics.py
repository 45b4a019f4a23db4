"""The ``fr_*`` Prometheus metrics, computed at scrape time from the agent's latest snapshot.

A custom collector (prometheus_client's extension point): ``collect()`` reads one
:class:`~fr_otel.agent.observe.state.Snapshot` and the clock, so the in-flight age keeps growing
between polls and while the job is stuck. The names and labels below are a contract
(dashboards and alerts are built on them); sequence numbers and trace ids are values or
exemplars, never labels.

=============================================  =======  ====================================
name                                           type     labels
=============================================  =======  ====================================
fr_inflight_collective_age_seconds             gauge    rank, pg_name, pg_desc, op
fr_inflight_collective_timeout_seconds         gauge    rank, pg_name, pg_desc, op
fr_inflight_p2p_age_seconds                    gauge    rank, pg_name, pg_desc, op, peer
fr_last_enqueued_seq                           gauge    rank, pg_name, pg_desc
fr_last_completed_seq                          gauge    rank, pg_name, pg_desc
fr_collective_wait_seconds_total               counter  rank, pg_name, pg_desc (exemplar: trace_id)
fr_collectives_completed_total                 counter  rank, pg_name, pg_desc
fr_incidents_total                             counter  rank (exemplar: trace_id)
fr_info                                        info     rank, local_rank, host, torch_version,
                                                        backend, world_size, recorder_capacity
fr_agent_polls_total                           counter  rank
fr_agent_errors_total                          counter  rank
fr_agent_export_failures_total                 counter  rank
fr_agent_last_poll_timestamp_seconds           gauge    rank
fr_recorder_enabled                            gauge    rank
fr_training_step                               gauge    rank (only once a step was counted)
fr_training_step_age_seconds                   gauge    rank (only once a step was counted)
fr_stall_threshold_seconds                     gauge    rank
fr_abort_after_seconds                         gauge    rank (only with --on-hang abort)
=============================================  =======  ====================================
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from ..observe.state import Health, Snapshot

__all__ = ["INFO_LABELS", "METRIC_NAMES", "FrCollector"]

INFO_LABELS = ("rank", "local_rank", "host", "torch_version", "backend", "world_size", "recorder_capacity")
_GROUP = ("rank", "pg_name", "pg_desc")
_INFLIGHT = (*_GROUP, "op")
_P2P = (*_INFLIGHT, "peer")

#: Every sample name the collector can emit (the contract, in one tuple).
METRIC_NAMES: tuple[str, ...] = (
    "fr_inflight_collective_age_seconds",
    "fr_inflight_collective_timeout_seconds",
    "fr_inflight_p2p_age_seconds",
    "fr_last_enqueued_seq",
    "fr_last_completed_seq",
    "fr_collective_wait_seconds_total",
    "fr_collectives_completed_total",
    "fr_incidents_total",
    "fr_info",
    "fr_agent_polls_total",
    "fr_agent_errors_total",
    "fr_agent_export_failures_total",
    "fr_agent_last_poll_timestamp_seconds",
    "fr_recorder_enabled",
    "fr_training_step",
    "fr_training_step_age_seconds",
    "fr_stall_threshold_seconds",
    "fr_abort_after_seconds",
)


class FrCollector(Collector):
    """Renders the snapshot ``source()`` returns; ``clock`` (epoch seconds) is injectable for tests."""

    def __init__(self, source: Callable[[], Snapshot | None], clock: Callable[[], float] = time.time) -> None:
        self._source = source
        self._clock = clock

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: names are fixed, label values appear at scrape time

    def collect(self) -> Iterator[Metric]:
        snap = self._source()
        if snap is None:
            return
        now_ns = int(self._clock() * 1e9)
        rank = snap.info.rank
        age = GaugeMetricFamily(
            "fr_inflight_collective_age_seconds",
            "Age of the oldest collective in flight in this process group on this rank (0 when none).",
            labels=_INFLIGHT,
        )
        timeout = GaugeMetricFamily(
            "fr_inflight_collective_timeout_seconds",
            "Timeout of that collective (0 when none in flight, or not yet known).",
            labels=_INFLIGHT,
        )
        enqueued = GaugeMetricFamily(
            "fr_last_enqueued_seq", "Sequence number of the last collective this rank enqueued in the group.",
            labels=_GROUP,
        )
        completed = GaugeMetricFamily(
            "fr_last_completed_seq", "Sequence number of the last collective this rank completed in the group.",
            labels=_GROUP,
        )
        p2p = GaugeMetricFamily(
            "fr_inflight_p2p_age_seconds",
            "Age of this rank's oldest pending send or recv to one peer (global rank) in the group.",
            labels=_P2P,
        )
        for g in snap.groups:
            labels = [rank, g.name, g.desc]
            for w in g.p2p:
                p2p.add_metric([*labels, w.op, "any" if w.peer is None else str(w.peer)], round(w.age_s(now_ns), 3))
            if g.has_p2p:
                continue  # per-rank p2p counters: nothing here may be compared across ranks
            op = g.op if g.inflight_since_ns is not None else ""
            age.add_metric([*labels, op], round(g.age_s(now_ns), 3))
            seconds = (g.timeout_ms or 0) / 1000 if g.inflight_since_ns is not None else 0.0
            timeout.add_metric([*labels, op], seconds)
            enqueued.add_metric(labels, g.enqueued)
            completed.add_metric(labels, g.completed)
        yield from (age, timeout, enqueued, completed)
        if p2p.samples:  # absent (not even HELP) in jobs without send/recv
            yield p2p

        h = snap.health
        if snap.waits:  # absent where this backend's recorder cannot tell a wait (NCCL without timing)
            yield from _waits(snap, h)
        incidents = CounterMetricFamily(
            "fr_incidents_total", "Incidents this rank took part in (raised or joined); exemplar: the trace id.",
            labels=["rank"],
        )
        exemplar = None
        if h.last_incident_trace_id:
            exemplar = Exemplar({"trace_id": h.last_incident_trace_id}, 1.0, h.last_incident_s)
        incidents.add_metric([rank], h.incidents, exemplar=exemplar)
        yield incidents
        if h.exclude_hosts:  # absent until an incident this rank concluded names hosts to leave out
            exclude = GaugeMetricFamily(
                "fr_exclude_host", "1 per host the last incident this rank concluded has evidence against, which a "
                "restart should leave out (lost, cut off, a device fault; never for a fault in the job's own code; "
                "exclude-hosts.txt).", labels=["rank", "incident", "exclude_host"])
            for host in h.exclude_hosts:
                exclude.add_metric([rank, str(h.exclude_incident), host], 1)
            yield exclude

        info = InfoMetricFamily("fr", "The process behind these series.", labels=INFO_LABELS)
        i = snap.info
        info.add_metric([i.rank, i.local_rank, i.host, i.torch_version, i.backend, i.world_size,
                         i.recorder_capacity], {})
        yield info

        for name, doc, value in (
            ("fr_agent_polls", "Recorder polls done by the fr-otel agent.", h.polls),
            ("fr_agent_errors", "Failures inside the agent (each counted, none reaches training).", h.errors),
            ("fr_agent_export_failures", "Incident traces not delivered to the collector (spooled to disk).",
             h.export_failures),
        ):
            counter = CounterMetricFamily(name, doc, labels=["rank"])
            counter.add_metric([rank], value)
            yield counter
        last = GaugeMetricFamily("fr_agent_last_poll_timestamp_seconds",
                                 "When the agent last read the recorder (epoch seconds).", labels=["rank"])
        last.add_metric([rank], h.last_poll_s or 0.0)
        yield last
        enabled = GaugeMetricFamily("fr_recorder_enabled", "1 when the Flight Recorder records (capacity > 0).",
                                    labels=["rank"])
        enabled.add_metric([rank], 1.0 if snap.recorder_enabled else 0.0)
        yield enabled
        if snap.step is not None:
            step = GaugeMetricFamily("fr_training_step", "The training step this rank is in (optimizer steps "
                                     "counted since the agent started, or fr_otel.step(n)).", labels=["rank"])
            step.add_metric([rank], snap.step)
            yield step
        if snap.step is not None and snap.step_started_ns is not None:
            age = GaugeMetricFamily("fr_training_step_age_seconds", "Seconds since this rank's current training "
                                    "step began (keeps growing while the step does not end).", labels=["rank"])
            age.add_metric([rank], round(max(now_ns - snap.step_started_ns, 0) / 1e9, 3))
            yield age
        yield from _thresholds(snap)


def _thresholds(snap: Snapshot) -> Iterator[Metric]:
    """This rank's own stall threshold (and abort age): the stall rules compare against them, so an alert keeps
    the pace of the job's ``--stall-seconds`` rather than a fixed number."""
    for name, doc, value in (
        ("fr_stall_threshold_seconds", "The age at which this rank's agent calls an in-flight collective stalled "
         "(--stall-seconds).", snap.stall_s),
        ("fr_abort_after_seconds", "The age at which a hang's stuck ranks exit (--on-hang abort, "
         "--abort-after-seconds).", snap.abort_after_s),
    ):
        if value is not None:
            gauge = GaugeMetricFamily(name, doc, labels=["rank"])
            gauge.add_metric([snap.info.rank], value)
            yield gauge


def _waits(snap: Snapshot, h: Health) -> Iterator[Metric]:
    """How long this rank waited in each group's collectives, and how many it completed (sampled)."""
    rank = snap.info.rank
    wait = CounterMetricFamily(
        "fr_collective_wait_seconds", "Seconds this rank spent waiting in the group's collectives (sampled from "
        "its progress counters; rate() is the share of its time). Exemplar: the latest incident's trace id.",
        labels=_GROUP,
    )
    done = CounterMetricFamily("fr_collectives_completed", "Collectives of the group this rank completed while the "
                               "agent watched.", labels=_GROUP)
    for w in snap.waits:
        exemplar = None
        if h.last_incident_trace_id:  # the value: the share of its recent time this rank waited
            exemplar = Exemplar({"trace_id": h.last_incident_trace_id}, round(w.recent_share, 3), h.last_incident_s)
        wait.add_metric([rank, w.name, w.desc], round(w.wait_s, 3), exemplar=exemplar)
        done.add_metric([rank, w.name, w.desc], w.completed)
    yield from (wait, done)

