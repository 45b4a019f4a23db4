"""The trace's span cap leaves out the oldest entry spans of all ranks, never a rank's newest because of where
its spans sit in the list."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from fr_otel.trace import attributes as A
from fr_otel.trace.spans import MAX_TRACE_SPANS, _capped


_RESOURCE = Resource.get_empty()  # one for all: a span made without one builds its own (~1.5 ms each)


def _entry(rank: int, start: int) -> ReadableSpan:
    return ReadableSpan(name=f"entry r{rank}", attributes={A.SPAN_ROLE: "entry", "rank": rank}, start_time=start,
                        end_time=start + 1, resource=_RESOURCE)


def test_the_cap_leaves_out_the_oldest_entries_of_any_rank_not_the_first_rank_s_newest() -> None:
    """Rank 0's spans come first in the list and are the newest (it is the culprit, still recording): over the
    cap by 10, the 10 spans left out are rank 1's oldest, and every rank-0 span stays; one note says so."""
    rank0 = [_entry(0, 2_000_000 + i) for i in range(100)]
    rank1 = [_entry(1, i) for i in range(MAX_TRACE_SPANS - 100 - 1 + 10)]
    notes: list[str] = []
    kept = _capped([*rank0, *rank1], notes)
    assert len(kept) == MAX_TRACE_SPANS - 1
    kept_ids = {id(sp) for sp in kept}
    assert all(id(sp) in kept_ids for sp in rank0)
    assert [sp.start_time for sp in rank1 if id(sp) not in kept_ids] == list(range(10))
    assert notes == [f"10 entry span(s) left out to keep the trace under {MAX_TRACE_SPANS} spans"]
