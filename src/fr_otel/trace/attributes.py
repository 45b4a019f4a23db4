"""The span attribute contract: every name fr-otel emits, in one place.

Dashboards, TraceQL queries and users build on these names (README has the
table). Generic OpenTelemetry names are reused where they fit (``thread.*``,
``code.*``, ``error.type``); the rest live under ``pytorch.distributed.*`` (what
the recorder says) and ``fr_otel.*`` (what the analysis concluded).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..common.text import MAX_ATTRIBUTE_CHARS, clip, printable

__all__ = [
    "MAX_LIST_ITEMS", "MAX_ITEM_CHARS", "bounded", "bounded_value",
    "RANK", "WORLD_SIZE", "BACKEND", "PG_NAME", "PG_DESC", "PG_SIZE", "SEQ_ID", "P2P_SEQ_ID", "OP_ID", "OP",
    "RECORD_ID", "STATE", "RETIRED", "COMPLETED", "IS_P2P", "TIMEOUT_MS", "INPUT_SIZES", "OUTPUT_SIZES",
    "INPUT_DTYPES", "OUTPUT_DTYPES", "DURATION_MS", "END_ESTIMATED", "IN_FLIGHT", "PAST_TIMEOUT",
    "ENTERED_RANKS", "MISSING_RANKS", "COMPLETED_RANKS", "MISMATCH", "VERDICT", "EXCLUDE_HOSTS", "CULPRIT_RANKS", "CULPRIT_KINDS",
    "CULPRIT_EVIDENCE", "NOTES", "PROBLEMS", "JOB_ID", "RANKS_LOADED", "HISTORY_GROUPS", "HISTORY_TOTAL",
    "HISTORY_EXPORTED", "HISTORY_FIRST_SEQ", "HISTORY_LAST_SEQ", "IS_CULPRIT", "CULPRIT_KIND", "CULPRIT_CAUSE", "CULPRIT_CAUSES", "CULPRIT_CAUSE_EVIDENCE", "STACK", "SPAN_ROLE",
    "THREAD_ID", "THREAD_NAME", "CODE_FUNCTION", "CODE_FILE", "CODE_LINE", "ERROR_TYPE", "TRAINING_STEP",
    "CULPRIT_HOSTS", "CULPRIT_NODES", "LOST_HOSTS", "HOST_FINDINGS", "FIRST_STOPPED", "STOP_ORDER_NOTE", "STOPPED_AFTER_S",
    "THREAD_ID", "THREAD_NAME", "CODE_FUNCTION", "CODE_FILE", "CODE_LINE", "ERROR_TYPE", "STACK_NOW", "NOW",
    "HOST_NAME", "PROCESS_PID", "STUCK", "UNKNOWN_RANKS", "RANKS", "RANKS_COUNT", "RANKS_STATE", "GROUPS",
    "GROUPS_COUNT", "SUMMARY", "RANKS_IN_FULL", "RANKS_AGGREGATED",
]

# What the recorder says (span and resource attributes)
RANK = "pytorch.distributed.rank"
WORLD_SIZE = "pytorch.distributed.world_size"
BACKEND = "pytorch.distributed.backend"
PG_NAME = "pytorch.distributed.pg.name"
PG_DESC = "pytorch.distributed.pg.desc"
PG_SIZE = "pytorch.distributed.pg.size"
SEQ_ID = "pytorch.distributed.collective.seq_id"
P2P_SEQ_ID = "pytorch.distributed.p2p.seq_id"
OP_ID = "pytorch.distributed.op_id"
OP = "pytorch.distributed.op"
RECORD_ID = "pytorch.distributed.record_id"
STATE = "pytorch.distributed.state"
RETIRED = "pytorch.distributed.retired"
COMPLETED = "pytorch.distributed.completed"
IS_P2P = "pytorch.distributed.is_p2p"
TIMEOUT_MS = "pytorch.distributed.timeout_ms"
INPUT_SIZES = "pytorch.distributed.input_sizes"
OUTPUT_SIZES = "pytorch.distributed.output_sizes"
INPUT_DTYPES = "pytorch.distributed.input_dtypes"
OUTPUT_DTYPES = "pytorch.distributed.output_dtypes"
DURATION_MS = "pytorch.distributed.duration_ms"
TRAINING_STEP = "pytorch.training.step"  # the training step a rank is in / a collective belongs to

# What fr-otel concluded
SPAN_ROLE = "fr_otel.span"  # incident | rank | entry | collective
END_ESTIMATED = "fr_otel.end_estimated"  # no completion time recorded (gloo): a bounded guess (read.dump.op_interval)
IN_FLIGHT = "fr_otel.in_flight"  # never completed before the dump
PAST_TIMEOUT = "fr_otel.past_timeout"
ENTERED_RANKS = "fr_otel.collective.entered_ranks"
MISSING_RANKS = "fr_otel.collective.missing_ranks"
COMPLETED_RANKS = "fr_otel.collective.completed_ranks"
MISMATCH = "fr_otel.collective.mismatch"
VERDICT = "fr_otel.verdict"
CULPRIT_RANKS = "fr_otel.culprit_ranks"
CULPRIT_KINDS = "fr_otel.culprit_kinds"
CULPRIT_EVIDENCE = "fr_otel.culprit_evidence"
IS_CULPRIT = "fr_otel.culprit"
CULPRIT_KIND = "fr_otel.culprit_kind"
#: Why a culprit stopped (diagnosis.cause): its class on a culprit's rank span and event; per blamed culprit on
#: the root (``fr_otel.culprit.causes``), and the evidence lines under ``fr_otel.culprit.cause.evidence``.
CULPRIT_CAUSE = "fr_otel.culprit.cause"
CULPRIT_CAUSES = "fr_otel.culprit.causes"
CULPRIT_CAUSE_EVIDENCE = "fr_otel.culprit.cause.evidence"
#: Whose fault the cause points at (``software``, ``infrastructure``, ``unknown``: diagnosis.cause_kinds.Domain):
#: on a culprit's rank span and event, and per blamed culprit on the root (``fr_otel.culprit.domains``).
CULPRIT_DOMAIN = "fr_otel.culprit.cause.domain"
CULPRIT_DOMAINS = "fr_otel.culprit.domains"
UNKNOWN_RANKS = "fr_otel.unknown_ranks"  # no readable dump, every wait on them explained by a culprit: not blamed
NOTES = "fr_otel.notes"
PROBLEMS = "fr_otel.problems"
JOB_ID = "fr_otel.job_id"
RANKS_LOADED = "fr_otel.ranks_loaded"
HISTORY_GROUPS = "fr_otel.history.groups"
HISTORY_TOTAL = "fr_otel.history.entries"
HISTORY_EXPORTED = "fr_otel.history.exported"
HISTORY_FIRST_SEQ = "fr_otel.history.first_seq"
HISTORY_LAST_SEQ = "fr_otel.history.last_seq"
STACK = "fr_otel.stack"
CULPRIT_HOSTS = "fr_otel.culprit_hosts"  # per culprit, "" where unknown
CULPRIT_NODES = "fr_otel.culprit_nodes"  # "node02: 9,14" for hosts with several culprits
LOST_HOSTS = "fr_otel.lost_hosts"  # hosts lost, cut off, or running a store that stopped answering
#: What to do with the job (diagnosis.restart.Action: ``fix_code``, ``restart_elsewhere``, ``restart_in_place``).
ACTION = "fr_otel.action"
EXCLUDE_HOSTS = "fr_otel.exclude_hosts"  # hang/desync: the hosts a restart should leave out (diagnosis.restart)
HOST_FINDINGS = "fr_otel.host_findings"  # one sentence each: "node1 (ranks 2-3): no dump; last heard ..."
FIRST_STOPPED = "fr_otel.first_stopped_rank"  # only when the clocks allow ordering the culprits
STOP_ORDER_NOTE = "fr_otel.stop_order.note"  # why the culprits cannot be ordered (and how far undated ones got)
STOPPED_AFTER_S = "fr_otel.stopped_after_s"  # a culprit: seconds after the first culprit stopped
STACK_NOW = "fr_otel.stack.now"  # the main thread's Python stack at incident time (live agent)
NOW = "fr_otel.now"  # what that stack says: "in time.sleep at train.py:27 in main"
STUCK = "fr_otel.stuck"  # an entry of the collective the incident is about, still in flight
# A trace of a large job shows culprits and their peers in full and the other ranks as one span per
# group kind and state (fr_otel.span = "ranks"):
RANKS = "fr_otel.ranks"  # the ranks one aggregate span stands for, as runs ("0-1364,1366-4095")
RANKS_COUNT = "fr_otel.ranks.count"
RANKS_STATE = "fr_otel.ranks.state"  # waiting | not_entered | no_dump | idle
GROUPS = "fr_otel.groups"  # the groups it covers (names, clipped)
GROUPS_COUNT = "fr_otel.groups.count"
SUMMARY = "fr_otel.summary"  # the span in one sentence: "4,093 ranks waiting in all_reduce #51234 on dp, ranks ..."
RANKS_IN_FULL = "fr_otel.trace.ranks_in_full"  # root: ranks with their own spans (None: every rank)
RANKS_AGGREGATED = "fr_otel.trace.ranks_aggregated"  # root: ranks shown only in aggregate spans

# Generic OpenTelemetry names
THREAD_ID = "thread.id"
THREAD_NAME = "thread.name"
CODE_FUNCTION = "code.function.name"
CODE_FILE = "code.file.path"
CODE_LINE = "code.line.number"
ERROR_TYPE = "error.type"
HOST_NAME = "host.name"
PROCESS_PID = "process.pid"


# --- Limits: what any one attribute may cost, whatever the dump held -----------------------

MAX_LIST_ITEMS = 1024
MAX_ITEM_CHARS = 256
MAX_LIST_CHARS = 16_000
_INT64 = (-(2**63), 2**63 - 1)


def _text(value: str, limit: int) -> str:
    return clip(printable(clip(value, limit), keep_lines=True), limit)  # escaping may lengthen it: clip again


def bounded_value(value: Any, limit: int = MAX_ATTRIBUTE_CHARS) -> Any:
    """One attribute value OTLP can encode, clipped: None when there is nothing to send.

    Strings are escaped and clipped to ``limit`` characters; ints outside int64 become
    text; lists keep their first :data:`MAX_LIST_ITEMS` items, each clipped to
    :data:`MAX_ITEM_CHARS`, all of one type (mixed lists become lists of strings).
    """
    kind = type(value)
    if kind is not str and isinstance(value, str):  # a StrEnum member (a verdict word, a kind): its text
        value, kind = str(value), str
    if kind is bool or kind is float:
        return value
    if kind is int:
        return value if _INT64[0] <= value <= _INT64[1] else _text(_int_text(value), limit)
    if kind is str:
        return _text(value, limit)
    if kind in (list, tuple):
        items = [bounded_value(v, MAX_ITEM_CHARS) for v in value[:MAX_LIST_ITEMS]]
        items = [v for v in items if v is not None and type(v) in (bool, int, float, str)]
        total = 0
        for n, v in enumerate(items):
            total += len(v) if type(v) is str else 8
            if total > MAX_LIST_CHARS:
                items = items[:n]
                break
        if len({type(v) for v in items}) > 1:
            items = [v if type(v) is str else _text(str(v), MAX_ITEM_CHARS) for v in items]
        return items
    if value is None:
        return None
    return _text(type(value).__name__, limit)


def _int_text(value: int) -> str:
    try:
        return str(value)
    except ValueError:  # over Python's 4300-digit limit
        return "<integer too large>"


def bounded(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Every attribute through :func:`bounded_value` (what spans and resources are built from)."""
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        clean = bounded_value(value)
        if clean is not None:
            out[_text(str(key), MAX_ITEM_CHARS)] = clean
    return out
