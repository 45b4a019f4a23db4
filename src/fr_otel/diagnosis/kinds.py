"""The analysis's vocabularies: the verdict word, the culprit kinds (with one table of what each
kind is) and where a group's membership came from.

Both are part of the public JSON schema, the span attributes and the log lines; as
:class:`~fr_otel.common.str_enum.StrEnum` members they compare and serialise as those very
strings, and the type checker finds every place a new member must reach. Everything said *about*
a kind (how strong its evidence is, whether it is blamed, its short label) lives in
:data:`KINDS`, so a new kind is one enum member and one row here; :func:`check_table` refuses a
table that misses one (the report's advice table is checked the same way).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from ..common.str_enum import StrEnum

__all__ = ["KINDS", "KIND_ORDER", "NOT_BLAMED", "CulpritKind", "KindInfo", "MembershipSource", "VerdictWord",
           "check_table", "kind_info"]


class VerdictWord(StrEnum):
    """The one word the analysis answers with (``verdict`` in the JSON)."""

    HANG = "hang"
    DESYNC = "desync"
    STRAGGLER = "straggler"
    HEALTHY = "healthy"
    INCONCLUSIVE = "inconclusive"
    FAILURE = "failure"  # the job's own code raised and ended it (diagnosis/failure.py)

    @property
    def stuck(self) -> bool:
        """Work is stuck (a hang or a desync): the verdicts that name where ranks stopped."""
        return self in (VerdictWord.HANG, VerdictWord.DESYNC)


class CulpritKind(StrEnum):
    """Why a rank is named (``kind`` of a culprit and of its related evidence)."""

    MISMATCH = "mismatch"
    NOT_COMPLETED = "not_completed"
    NOT_ENQUEUED = "not_enqueued"
    MISSING_DUMP = "missing_dump"
    STRAGGLER = "straggler"
    UNKNOWN = "unknown"


class MembershipSource(StrEnum):
    """Where a process group's members come from (``membership`` of a group in the JSON)."""

    PG_CONFIG = "pg_config"  # the dump's pg_config (sound under NCCL; empty under gloo)
    ENTRIES = "entries"  # the ranks whose entries name the group
    WORLD = "world"  # the default group of an inferred world: every rank


@dataclass(frozen=True, slots=True)
class KindInfo:
    """What the analysis and every rendering say about one culprit kind."""

    order: int  # strength of the evidence, strongest first: a rank keeps its strongest kind
    label: str  # the short label on the page's badges ("never enqueued")
    blamed: bool = True  # False: reported, not blamed (a rank whose silence a proven culprit explains)
    waiters: str = "Waited on by"  # what the page calls the ranks of ``waiting_ranks``


#: Every culprit kind, strongest evidence first.
KINDS: Mapping[CulpritKind, KindInfo] = {
    CulpritKind.MISMATCH: KindInfo(0, "mismatch", waiters="Its peers (called differently)"),
    CulpritKind.NOT_COMPLETED: KindInfo(1, "did not complete"),
    CulpritKind.NOT_ENQUEUED: KindInfo(2, "never enqueued"),
    CulpritKind.MISSING_DUMP: KindInfo(3, "no dump"),
    CulpritKind.STRAGGLER: KindInfo(4, "straggler"),
    CulpritKind.UNKNOWN: KindInfo(5, "state unknown", blamed=False),
}


def check_table(what: str, kinds: Iterable[str], table: Collection[str]) -> None:
    """Raise if ``table`` (named ``what``) lacks a row for one of ``kinds`` or has one for no kind:
    run at import, so a kind added without its row fails the first import, not a user's incident."""
    wanted = set(kinds)
    missing, extra = sorted(wanted - set(table)), sorted(set(table) - wanted)
    if missing or extra:
        raise RuntimeError(f"{what}: no row for kind(s) {', '.join(missing) or '-'}; "
                           f"rows for no kind: {', '.join(extra) or '-'}")


check_table("diagnosis.kinds.KINDS", CulpritKind, KINDS)
if sorted(i.order for i in KINDS.values()) != list(range(len(KINDS))):  # pragma: no cover - a typo in the table
    raise RuntimeError("diagnosis.kinds.KINDS: the orders are not 0..n-1, each once")

#: The kinds, strongest evidence first.
KIND_ORDER: tuple[CulpritKind, ...] = tuple(sorted(KINDS, key=lambda k: KINDS[k].order))
#: Kinds that are reported, not blamed: ``unknown`` is a rank without a readable dump whose
#: every wait a proven culprit explains.
NOT_BLAMED = frozenset(k for k, i in KINDS.items() if not i.blamed)


def kind_info(kind: str) -> KindInfo:
    """The row of ``kind``; a KeyError naming it for a string that is no kind."""
    try:
        return KINDS[CulpritKind(kind)]
    except ValueError:
        raise KeyError(f"not a culprit kind: {kind!r}") from None
