"""A group's seq column: stored as a range when contiguous, and every reader of it agrees either way."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from fr_otel.diagnosis.job import _progress_from_entries
from fr_otel.read.columns import summarise
from fr_otel.read.dump import GroupHistory


def _history(seq: array | range, done: bytes) -> GroupHistory:
    n = len(seq)
    return GroupHistory(name="0", desc="default_pg", local_id=0, seq=seq, completed=done,
                        created_ns=array("q", range(n)), fingerprint=array("q", [7] * n))


def _entry(seq: int, done: bool) -> dict:
    return {"record_id": seq, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "profiling_name": "gloo:all_reduce", "time_created_ns": 1_000 + seq, "input_sizes": [[4]],
            "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"], "is_p2p": False,
            "retired": done, "state": "scheduled"}


@settings(max_examples=200, deadline=None)
@given(first=st.integers(0, 10**6), gaps=st.lists(st.sampled_from([0, 1, 1, 1, 2]), min_size=1, max_size=40),
       done=st.data())
def test_the_reader_stores_exactly_the_contiguous_runs_as_ranges_and_progress_and_position_read_both_alike(
        first: int, gaps: list[int], done: st.DataObject) -> None:
    """Gaps (step 2) and coalesced ops (step 0) keep an array; first..last with step 1 becomes a range.
    Progress read through the range's shortcut equals progress read from the same values as an array."""
    seqs, at = [], first
    for step in gaps:
        at += step
        seqs.append(at)
    flags = done.draw(st.lists(st.booleans(), min_size=len(seqs), max_size=len(seqs)))
    summary = summarise([_entry(s, f) for s, f in zip(seqs, flags)], gloo=True)
    assert summary is not None
    history = summary.histories["0"]
    contiguous = seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert history.contiguous is contiguous
    assert type(history.seq) is (range if contiguous else array)
    assert list(history.seq) == seqs
    as_array = _history(array("q", seqs), bytes(flags))
    assert not as_array.contiguous
    assert _progress_from_entries(history) == _progress_from_entries(as_array)
    for seq in range(seqs[0] - 2, seqs[-1] + 3):
        expected = seqs.index(seq) if seq in seqs else None  # the first op of a coalesced seq
        assert history.position(seq) == expected
        assert as_array.position(seq) == expected
