"""What raised a live incident is built and read back in one place: the store's record and the root span's
attributes both come back as the same trigger, an untrusted record never as a wrong one, and the analysis
reads the trigger, never span attributes."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fr_otel.diagnosis.verdict import AnalysisOptions
from fr_otel.incident.trigger import Reason, SeenStall, Trigger

NOW = 1_790_000_000_000_000_000
STALL = Trigger.for_stall(SeenStall("0", 88, "all_reduce", 12.5, "default_pg"), 10.0).raised(3, 2, NOW)
SLOW = Trigger.for_slow("host node1", "5", "dp", (2, 3), "node1", "node1 (ranks 2-3) holds up dp", 45.0).raised(1, 0, NOW)


@pytest.mark.parametrize(("trigger", "reason", "words"), [
    (Trigger.for_stall(SeenStall("0", 1), 5.0), Reason.STALL, "stall"),
    (SLOW, Reason.SLOW, "slow: host node1 holds up group 5 (dp)"),
    (Trigger.for_exception(RuntimeError("boom\n  at step 5")), Reason.UNCAUGHT, "uncaught RuntimeError: boom at step 5"),
    (Trigger.for_sigterm(True), Reason.SIGTERM, "SIGTERM while a collective was in flight"),
    (Trigger.for_sigterm(False), Reason.SIGTERM, "SIGTERM"),
    (Trigger.requested("manual"), Reason.REQUESTED, "manual"),
])
def test_each_way_of_raising_says_its_reason_in_words_that_read_back_as_it(trigger: Trigger, reason: Reason,
                                                                           words: str) -> None:
    """The words each constructor writes are what an older incident.json holds too: they read back as that reason."""
    assert (trigger.reason, trigger.words, Reason.of(trigger.words)) == (reason, words, reason)


@pytest.mark.parametrize("trigger", [STALL, SLOW, Trigger.for_sigterm(True).raised(2, 1, NOW)])
def test_the_store_record_and_the_root_attributes_read_back_as_the_same_trigger(trigger: Trigger) -> None:
    """Through the store (JSON, as the channel writes it) every field comes back; through incident.json's root
    attributes, all but the time and the slow ranks (the trace carries neither)."""
    record = json.loads(json.dumps(trigger.to_record(), sort_keys=True))
    assert Trigger.from_record(trigger.number, record) == trigger
    back = Trigger.from_root_attributes(json.loads(json.dumps(trigger.root_attributes())))
    assert back is not None
    assert (back.reason, back.words, back.number, back.raised_by, back.threshold_s) == (
        trigger.reason, trigger.words, trigger.number, trigger.raised_by, trigger.threshold_s)
    assert back.stall == (None if trigger.stall is None else SeenStall(
        trigger.stall.pg_name, trigger.stall.seq, trigger.stall.op, trigger.stall.age_s))  # no pg_desc in the trace


def test_root_attributes_keep_the_order_and_values_the_trace_has_always_had() -> None:
    """Number, reason, raiser, (a node's own part: its host), then what the raiser saw, in that order."""
    assert STALL.root_attributes(local_to="node1") == (
        ("fr_otel.incident.number", 3), ("fr_otel.incident.reason", "stall"), ("fr_otel.incident.raised_by", 2),
        ("fr_otel.incident.local_to", "node1"), ("fr_otel.incident.detected.pg_name", "0"),
        ("fr_otel.incident.detected.seq", 88), ("fr_otel.incident.detected.op", "all_reduce"),
        ("fr_otel.incident.detected.age_s", 12.5), ("fr_otel.incident.detected.threshold_s", 10.0))
    assert SLOW.root_attributes() == (
        ("fr_otel.incident.number", 1), ("fr_otel.incident.reason", "slow: host node1 holds up group 5 (dp)"),
        ("fr_otel.incident.raised_by", 0), ("fr_otel.incident.detected.threshold_s", 45.0))


@pytest.mark.parametrize("record", [
    {}, {"rank": 0, "time_ns": NOW}, {"rank": 0, "reason": "stall"}, {"time_ns": NOW, "reason": "stall"},
    {"rank": True, "time_ns": NOW, "reason": "stall"}, {"rank": "0", "time_ns": NOW, "reason": "stall"},
    {"rank": 0, "time_ns": float(NOW), "reason": "stall"}, {"rank": 0, "time_ns": NOW, "reason": ["stall"]},
])
def test_a_record_without_a_raiser_a_time_and_a_reason_is_no_trigger(record: dict[str, object]) -> None:
    assert Trigger.from_record(1, record) is None


def test_ill_typed_fields_of_a_record_are_dropped_not_trusted() -> None:
    """A forged record's extra fields cannot smuggle a stall key, slow ranks or a threshold of the wrong type."""
    forged = {"rank": 0, "time_ns": NOW, "reason": "slow: host x holds up group 0 ()", "pg_name": 0, "seq": "7",
              "threshold_s": float("nan"), "slow_ranks": [1, "2", True, 3.0, 4], "slow_host": 5, "detail": None,
              "claim": 7}
    trigger = Trigger.from_record(1, forged)
    assert trigger is not None
    assert (trigger.stall, trigger.threshold_s, trigger.slow_ranks, trigger.slow_host, trigger.detail, trigger.claim) \
        == (None, None, (1, 4), None, "", "")
    stall = Trigger.from_record(1, {**forged, "reason": "stall", "slow_ranks": [1], "slow_host": "x", "detail": "y"})
    assert stall is not None and (stall.slow_ranks, stall.slow_host, stall.detail) == ((), None, "")  # not a slow one
    named = Trigger.from_record(1, {**forged, "pg_name": "0", "op": 3, "age_s": True})
    assert named is not None and named.stall == SeenStall("0", None, None, None) and named.stall.key == ("0", None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a busy box draws slowly
@given(st.dictionaries(st.sampled_from(["rank", "time_ns", "reason", "pg_name", "pg_desc", "seq", "op", "age_s",
                                        "threshold_s", "slow_ranks", "slow_host", "detail", "claim"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                                 st.lists(st.one_of(st.integers(), st.text(max_size=3)), max_size=4))))
def test_any_json_record_reads_as_a_well_typed_trigger_or_none(record: dict[str, object]) -> None:
    """Whatever the store holds: a trigger whose every field has its type (and encodes again), or None."""
    trigger = Trigger.from_record(4, record)
    if trigger is None:
        return
    assert type(trigger.raised_by) is int and type(trigger.time_ns) is int and isinstance(trigger.words, str)
    assert all(type(r) is int for r in trigger.slow_ranks)
    assert trigger.threshold_s is None or isinstance(trigger.threshold_s, float)
    assert Trigger.from_record(4, json.loads(json.dumps(trigger.to_record()))) == trigger


@pytest.mark.parametrize(("trigger", "asked"), [
    (Trigger.for_exception(ValueError("x")), AnalysisOptions(ending=True)),
    (Trigger.for_sigterm(False), AnalysisOptions(ending=True)),
    (STALL, AnalysisOptions(raised_over_s=10.0)),
    (SLOW, AnalysisOptions(running_stall_s=45.0)),
    (Trigger.requested("manual"), AnalysisOptions()),
    (Trigger.requested("stall"), AnalysisOptions()),  # a stall without its threshold: weighed as a snapshot
    (Trigger.for_stall(SeenStall("0", 1), 0.0), AnalysisOptions()),
    (Trigger.for_stall(SeenStall("0", 1), 1e12), AnalysisOptions()),
])
def test_the_analysis_is_asked_for_what_the_trigger_says(trigger: Trigger, asked: AnalysisOptions) -> None:
    """As the job ended every wait counts; a stall counts a wait as old as its threshold; a slow host's
    incident counts none younger than the stall threshold; anything else is analysed as it is."""
    assert trigger.analysis(AnalysisOptions()) == asked
