"""What raised a live incident: its number, why, who raised it, and the stall or the slow ranks it is about.

Built in one place (the constructors below, called by the agent when it raises) and read back in one place
(:meth:`Trigger.from_record`, what the job's store holds; :meth:`Trigger.from_root_attributes`, what
``incident.json`` kept of the trace's root span). The analysis takes it as input (:meth:`Trigger.analysis`),
never by parsing span attributes: an incident raised as the job ended counts every wait, one raised for a stall
counts a wait as old as its threshold as stuck, one raised for a slow host counts none younger than that.

A store record is untrusted (anything that reaches the store's port can write one): ill-typed fields are
dropped, and a record without a raiser, a time and a reason is no trigger at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from ..common.json_types import is_exact_int, is_exact_number
from ..diagnosis.verdict import AnalysisOptions

__all__ = ["DETECTED_PREFIX", "NUMBER_ATTRIBUTE", "RAISED_BY_ATTRIBUTE", "REASON_ATTRIBUTE", "Reason", "SeenStall",
           "Trigger"]

#: The root span attribute (and root attribute of incident.json) that says why the incident was raised.
REASON_ATTRIBUTE = "fr_otel.incident.reason"
NUMBER_ATTRIBUTE = "fr_otel.incident.number"
RAISED_BY_ATTRIBUTE = "fr_otel.incident.raised_by"
LOCAL_TO_ATTRIBUTE = "fr_otel.incident.local_to"
#: Root attributes saying what the live agent saw when it raised the incident: ``DETECTED_PREFIX + key``, for
#: the keys of :data:`_DETECTED_KEYS`, in that order.
DETECTED_PREFIX = "fr_otel.incident.detected."
_DETECTED_KEYS = ("pg_name", "seq", "op", "age_s", "threshold_s")
_SLOW_PREFIX = "slow: "


class Reason(str, Enum):
    """Why an incident was raised; the words people read stay in :attr:`Trigger.words`."""

    STALL = "stall"  # a collective in flight past the stall threshold
    SLOW = "slow"  # a host or rank holds up a group while the job runs
    UNCAUGHT = "uncaught"  # an uncaught exception in the training process: the job ends
    SIGTERM = "sigterm"  # the launcher ends the job
    REQUESTED = "requested"  # a flush the job asked for (``fr_otel.flush(reason)``)

    @classmethod
    def of(cls, words: str) -> Reason:
        """The reason the agent's words say (how the agent words each: :class:`Trigger`'s constructors)."""
        if words == "stall":
            return cls.STALL
        if words.startswith(_SLOW_PREFIX):
            return cls.SLOW
        if words.startswith("uncaught "):
            return cls.UNCAUGHT
        if words.startswith("SIGTERM"):
            return cls.SIGTERM
        return cls.REQUESTED

    @property
    def ends_job(self) -> bool:
        """Raised as the job ended: nothing in flight will finish now."""
        return self in (Reason.UNCAUGHT, Reason.SIGTERM)


@dataclass(frozen=True, slots=True)
class SeenStall:
    """The wait the raiser saw: its group, the collective in flight there, and how long it had been."""

    pg_name: str
    seq: int | None
    op: str | None = None
    age_s: float | None = None
    pg_desc: str = ""

    @property
    def key(self) -> tuple[str, int | None]:
        """Which stall this is (as :attr:`fr_otel.agent.observe.poller.Stall.key` says it)."""
        return self.pg_name, self.seq


@dataclass(frozen=True, slots=True)
class Trigger:
    """One incident's cause as the raiser saw it (see the module's docstring)."""

    reason: Reason
    words: str  # the reason as the log and the trace say it
    raised_by: int = -1  # -1 until raised
    time_ns: int = 0
    number: int = 0  # 0 until raised
    stall: SeenStall | None = None
    threshold_s: float | None = None  # a stall's threshold; a slow incident's: the agent's stall threshold
    slow_ranks: tuple[int, ...] = ()
    slow_host: str | None = None
    detail: str = ""  # a slow incident's log line
    claim: str = ""  # the raiser's mark in the store (see fr_otel.agent.links.channel), as read there

    # -- built here only -------------------------------------------------------------------------
    @classmethod
    def for_stall(cls, stall: SeenStall, threshold_s: float) -> Trigger:
        return cls(Reason.STALL, "stall", stall=stall, threshold_s=threshold_s)

    @classmethod
    def for_slow(cls, who: str, pg_name: str, pg_desc: str, ranks: Iterable[int], host: str | None, line: str,
                 threshold_s: float) -> Trigger:
        return cls(Reason.SLOW, f"{_SLOW_PREFIX}{who} holds up group {pg_name} ({pg_desc})",
                   slow_ranks=tuple(ranks), slow_host=host, detail=line, threshold_s=threshold_s)

    @classmethod
    def for_exception(cls, exc: BaseException) -> Trigger:
        return cls(Reason.UNCAUGHT, f"uncaught {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")

    @classmethod
    def for_sigterm(cls, in_flight: bool) -> Trigger:
        return cls(Reason.SIGTERM, "SIGTERM while a collective was in flight" if in_flight else "SIGTERM")

    @classmethod
    def requested(cls, words: str) -> Trigger:
        """A flush the job asked for, in its own words (words the agent uses for its own reasons read as those)."""
        return cls(Reason.of(words), words)

    def raised(self, number: int, by: int, time_ns: int) -> Trigger:
        """This trigger as incident ``number``, raised by rank ``by`` at ``time_ns``."""
        return replace(self, number=number, raised_by=by, time_ns=time_ns, claim="")

    # -- one encoding for the store ----------------------------------------------------------------
    def to_record(self) -> dict[str, Any]:
        """The owner record the store keeps (JSON; the channel adds the raiser's mark)."""
        record: dict[str, Any] = {"rank": self.raised_by, "reason": self.words, "time_ns": self.time_ns}
        if self.stall is not None:
            s = self.stall
            record.update(pg_name=s.pg_name, pg_desc=s.pg_desc, seq=s.seq, op=s.op, age_s=s.age_s)
        if self.threshold_s is not None:
            record["threshold_s"] = self.threshold_s
        if self.reason is Reason.SLOW:
            record.update(slow_ranks=list(self.slow_ranks), slow_host=self.slow_host, detail=self.detail)
        if self.claim:
            record["claim"] = self.claim
        return record

    @classmethod
    def from_record(cls, number: int, record: Mapping[str, Any]) -> Trigger | None:
        """Incident ``number``'s owner record as a trigger; None unless it names a raiser, a time and a reason."""
        rank, when, words = record.get("rank"), record.get("time_ns"), record.get("reason")
        if not (is_exact_int(rank) and is_exact_int(when) and isinstance(words, str)):
            return None
        reason, claim = Reason.of(words), record.get("claim")
        trigger = cls(reason, words, rank, when, number, stall=_stall(record), threshold_s=_number(record.get("threshold_s")),
                      claim=claim if isinstance(claim, str) else "")
        if reason is not Reason.SLOW:
            return trigger
        ranks, host, detail = record.get("slow_ranks"), record.get("slow_host"), record.get("detail")
        return replace(trigger, slow_ranks=tuple(r for r in ranks if is_exact_int(r)) if isinstance(ranks, list) else (),
                       slow_host=host if isinstance(host, str) else None, detail=detail if isinstance(detail, str) else "")

    # -- one encoding for the root span (and incident.json) ---------------------------------------
    def root_attributes(self, local_to: str | None = None) -> tuple[tuple[str, Any], ...]:
        """The trace's root attributes: number, reason, raiser, the host of a node's own part (``local_to``), and
        what the raiser saw."""
        root: list[tuple[str, Any]] = [(NUMBER_ATTRIBUTE, self.number), (REASON_ATTRIBUTE, self.words),
                                       (RAISED_BY_ATTRIBUTE, self.raised_by)]
        if local_to is not None:
            root.append((LOCAL_TO_ATTRIBUTE, local_to))
        s = self.stall
        seen = {"pg_name": s.pg_name, "seq": s.seq, "op": s.op, "age_s": s.age_s} if s is not None else {}
        if self.threshold_s is not None:
            seen["threshold_s"] = self.threshold_s
        root.extend((DETECTED_PREFIX + key, seen[key]) for key in _DETECTED_KEYS if key in seen)
        return tuple(root)

    @classmethod
    def from_root_attributes(cls, attributes: Iterable[tuple[str, Any]]) -> Trigger | None:
        """The trigger ``incident.json`` kept (its root attributes); None when they name no reason."""
        attrs = dict(attributes)
        words = attrs.get(REASON_ATTRIBUTE)
        if not isinstance(words, str):
            return None
        seen = {k.removeprefix(DETECTED_PREFIX): v for k, v in attrs.items() if k.startswith(DETECTED_PREFIX)}
        number, by = attrs.get(NUMBER_ATTRIBUTE), attrs.get(RAISED_BY_ATTRIBUTE)
        return cls(Reason.of(words), words, by if is_exact_int(by) else -1, 0, number if is_exact_int(number) else 0,
                   stall=_stall(seen), threshold_s=_number(seen.get("threshold_s")))

    # -- what it means ----------------------------------------------------------------------------
    def analysis(self, base: AnalysisOptions) -> AnalysisOptions:
        """The analysis' options for an incident raised so: as the job ended, every wait counts; raised for a
        stall over a threshold, a wait that old is stuck; raised for a slow host, none younger is."""
        if self.reason.ends_job:
            return replace(base, ending=True)
        threshold = self.threshold_s if self.threshold_s is not None and 0 < self.threshold_s < 1e9 else None
        if threshold is not None and self.reason is Reason.SLOW:
            return replace(base, running_stall_s=threshold)
        if threshold is not None and self.reason is Reason.STALL:
            return replace(base, raised_over_s=threshold)
        return base

    def describe(self) -> str:
        """The trigger as a sentence for the log."""
        s = self.stall
        if s is None:
            return self.words
        return (f"{s.op or 'collective'} #{s.seq} on group {s.pg_name} ({s.pg_desc}) in flight {s.age_s} s "
                f"(threshold {self.threshold_s} s)")


def _number(value: Any) -> float | None:
    """A finite number as a float; anything else (NaN, infinities, a bool, text) is no number here."""
    return float(value) if is_exact_number(value) and math.isfinite(value) else None


def _stall(fields: Mapping[str, Any]) -> SeenStall | None:
    """The stall a record or the detected attributes name: a group, and the rest where well typed."""
    name, seq, op, age, desc = (fields.get(k) for k in ("pg_name", "seq", "op", "age_s", "pg_desc"))
    if not isinstance(name, str):
        return None
    return SeenStall(name, seq if is_exact_int(seq) else None, op if isinstance(op, str) else None, _number(age),
                     desc if isinstance(desc, str) else "")
