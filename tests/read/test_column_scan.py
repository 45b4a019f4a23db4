"""The compiled column scan gives exactly what the pure-Python builder gives, for every input.

``fr_otel.read._column_scan`` (C) takes only canonical entries and answers None for anything
else, leaving that case to Python: so on any list of entries, good or hostile, ``summarise``
(compiled where it can) must equal ``summarise_in_python`` (the reference), and on real dumps the
compiled path must actually be the one taken.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fr_otel.read import columns
from fr_otel.read.columns import summarise, summarise_in_python
from support.hostile_dumps import nccl_dump

DATA = Path(__file__).resolve().parents[1] / "data" / "nvrx-fr-traces"


def test_the_compiled_scan_is_built_and_in_use() -> None:
    """scripts/setup.sh builds it (gcc and the Python headers are set up by setup-system.sh)."""
    assert columns.COMPILED, "fr_otel.read._column_scan was not built: reinstall with a C compiler (pip install -e .)"


def test_fr_otel_pure_python_turns_the_compiled_scan_off() -> None:
    code = "from fr_otel.read import columns; print(columns.COMPILED)"
    env = {**os.environ, "FR_OTEL_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _scanned(raw: list[Any], gloo: bool) -> bool:
    fp = columns._FINGERPRINTS
    return columns._compiled_scan(raw, gloo, fp.canonical, fp.id_of_call) is not None


def _real_dumps() -> list[tuple[str, dict[str, Any]]]:
    dumps = [(f"hostile_dumps rank {r}", nccl_dump(r)) for r in range(4)]
    for path in sorted(DATA.glob("*/*")):
        if path.is_file() and path.read_bytes()[:1] == b"\x80":
            with open(path, "rb") as fh:
                dumps.append((str(path.relative_to(DATA)), pickle.load(fh)))  # the repo's own fixtures
    return dumps


def test_on_real_dumps_the_compiled_path_is_taken_and_agrees() -> None:
    dumps = _real_dumps()
    assert len(dumps) > 10
    for name, dump in dumps:
        raw = dump["entries"]
        gloo = bool(raw) and raw[0]["profiling_name"].startswith("gloo:")
        assert _scanned(raw, gloo), name
        compiled, reference = summarise(raw, gloo), summarise_in_python(raw, gloo)
        assert compiled is not None, name
        assert compiled == reference, name


# --------------------------------------------------------------------------- hostile and odd entries

_NAMES = st.sampled_from(["0", "1", "tp:0", "\x1b[31m", "é"])
_GROUPS = st.one_of(
    st.tuples(_NAMES, st.sampled_from(["default_pg", "tp", "dp\n"])),
    st.sampled_from([["0", "default_pg"], ("0",), ("0", "a", "b"), ("0", 7), (1, "x"), None, "0"]),
)
_INTS = st.one_of(st.integers(0, 2000), st.sampled_from([-1, True, False, 2**63 - 1, 2**63, -(2**63), 2**70, 1.5, "3"]))
_FLAGS = st.sampled_from([True, False, 0, 1, 2, -1, None, "True", 1.0])
_STATES = st.sampled_from(["completed", "scheduled", "started", "", None, 1, b"completed"])
_DIMS = st.lists(st.one_of(st.integers(0, 64), st.sampled_from([-1, True, 2**63, 1.0, "4"])), max_size=4)
_SHAPES = st.one_of(st.lists(_DIMS, max_size=3), st.lists(st.tuples(st.integers(0, 8)), max_size=2),
                    st.sampled_from([None, (), "[[4]]", [[[1]]], [None], {"a": 1}]))
_DTYPES = st.one_of(st.lists(st.sampled_from(["Float", "Long", "BFloat16", "\x00", 3, None]), max_size=3),
                    st.sampled_from([None, ("Float",), "Float"]))
_OPS = st.sampled_from(["gloo:all_reduce", "nccl:all_reduce", "nccl:send 0->1", "nccl:recv 1->0",
                        "nccl:all_gather", "nccl:scatter", "nccl:all_to_all", "nccl:gather", "\x07", 5, None])
_OPTIONAL = ("is_p2p", "retired", "state", "pg_id", "record_id")


@st.composite
def _entry(draw: st.DrawFn, index: int) -> Any:
    if draw(st.integers(0, 40)) == 0:
        return draw(st.sampled_from([None, [], "entry", 3, ("a", "b")]))
    e: dict[Any, Any] = {
        "record_id": index, "pg_id": draw(st.one_of(st.integers(0, 3), st.sampled_from(["0", None, 1.5]))),
        "process_group": draw(_GROUPS), "collective_seq_id": draw(_INTS), "p2p_seq_id": 0, "op_id": index,
        "profiling_name": draw(_OPS), "time_created_ns": draw(_INTS), "input_sizes": draw(_SHAPES),
        "input_dtypes": draw(_DTYPES), "output_sizes": draw(_SHAPES), "output_dtypes": draw(_DTYPES),
        "state": draw(_STATES), "retired": draw(_FLAGS), "is_p2p": draw(_FLAGS),
        "time_discovered_completed_ns": draw(st.one_of(st.none(), _INTS)), "frames": [],
    }
    for key in draw(st.lists(st.sampled_from(_OPTIONAL + ("process_group", "input_sizes")), max_size=2)):
        e.pop(key, None)
    if draw(st.integers(0, 20)) == 0:
        e[draw(st.sampled_from([1, ("process_group",), "extra"]))] = "x"
    return e


@st.composite
def _entries(draw: st.DrawFn) -> list[Any]:
    """Mostly well-formed entries (so whole lists often pass), with odd values mixed in."""
    n = draw(st.integers(0, 12))
    plain = draw(st.integers(0, 2)) > 0
    good = {"process_group": ("0", "default_pg"), "profiling_name": "gloo:all_reduce", "input_sizes": [[4, 4]],
            "input_dtypes": ["Float"], "output_sizes": [[4, 4]], "output_dtypes": ["Float"], "pg_id": 0,
            "is_p2p": False, "retired": True, "state": "completed", "frames": []}
    out: list[Any] = []
    for i in range(n):
        if plain and draw(st.integers(0, 5)) > 0:
            out.append({**good, "record_id": i, "collective_seq_id": i + 1, "time_created_ns": 10 * i,
                        "retired": draw(st.booleans()), "input_sizes": [[draw(st.integers(1, 3))]]})
        else:
            out.append(draw(_entry(i)))
    return out


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_entries(), gloo=st.booleans())
def test_on_any_entries_the_compiled_scan_agrees_with_python(raw: list[Any], gloo: bool) -> None:
    assert summarise(raw, gloo) == summarise_in_python(raw, gloo)


@pytest.mark.parametrize("gloo", [True, False])
def test_entries_whose_keys_sit_elsewhere_are_read_by_key(gloo: bool) -> None:
    """The scan reads a field at the slot it had in the first entry only when the very same key
    object is there: shuffled key orders, deleted slots, and equal keys that are other str objects
    (as a JSON dump or another writer makes them) are read by key, and agree with Python."""
    import random

    rng = random.Random(7)
    first = nccl_dump(0)["entries"]
    raw: list[Any] = []
    for i, e in enumerate(first * 4):
        e = dict(e, record_id=i, collective_seq_id=i + 1, time_created_ns=10 * i, retired=i % 3 == 0)
        if i % 4 == 1:  # another order
            items = list(e.items())
            rng.shuffle(items)
            e = dict(items)
        elif i % 4 == 2:  # a deleted slot before the fields
            e = {"gone": 1, **e}
            del e["gone"]
        elif i % 4 == 3:  # equal keys, other objects
            e = {"".join(list(k)): v for k, v in e.items()}
        raw.append(e)
    assert _scanned(raw, gloo)
    assert summarise(raw, gloo) == summarise_in_python(raw, gloo)


def test_a_shared_list_bomb_is_left_to_python_and_read_in_bounded_time() -> None:
    """One list shared by memo reference, nested: 2**60 values unrolled. The scan stops counting
    at its bound; Python (marshal 4 keeps the sharing) rejects the call: the slow path decides."""
    bomb: list[Any] = [[1]]
    for _ in range(60):
        bomb = [bomb, bomb]
    entry = {"process_group": ("0", "pg"), "collective_seq_id": 1, "time_created_ns": 1, "is_p2p": False,
             "retired": False, "profiling_name": "gloo:all_reduce", "input_sizes": bomb, "input_dtypes": ["Float"],
             "output_sizes": [], "output_dtypes": [], "pg_id": 0}
    assert not _scanned([entry], True)
    assert summarise([entry], True) is None
    wide: list[Any] = [[1] * 64] * 4096
    entry["input_sizes"] = wide
    assert not _scanned([entry], True)
    assert summarise([entry], True) == summarise_in_python([entry], True)


@pytest.mark.parametrize("gloo", [True, False])
def test_groups_with_one_name_and_two_descs_split_by_name_as_python_does(gloo: bool) -> None:
    base = {"is_p2p": False, "retired": True, "state": "completed", "profiling_name": "gloo:all_reduce",
            "input_sizes": [[1]], "input_dtypes": ["Float"], "output_sizes": [[1]], "output_dtypes": ["Float"],
            "pg_id": 0}
    raw = [{**base, "process_group": ("0", desc), "collective_seq_id": i, "time_created_ns": i}
           for i, desc in enumerate(["a", "b", "a", "\x1b"])]
    assert _scanned(raw, gloo)
    assert summarise(raw, gloo) is None  # a non-printable desc: the slow path, as in Python
    assert summarise_in_python(raw, gloo) is None
    raw.pop()
    compiled = summarise(raw, gloo)
    assert compiled is not None and compiled == summarise_in_python(raw, gloo)
    assert list(compiled.histories) == ["0"] and compiled.histories["0"].desc == "a"


def test_a_call_over_the_size_limit_as_marshalled_is_refused_on_both_paths() -> None:
    """The limit is the Python path's (marshal 4 writes 15 bytes per int >= 2**30, the scan's own
    encoding 9): the scan asks the Python path for every call it has not met, so both refuse it."""
    entry = {"process_group": ("0", "pg"), "collective_seq_id": 1, "time_created_ns": 1, "is_p2p": False,
             "retired": False, "profiling_name": "nccl:all_reduce" + "x" * 100_000, "pg_id": 0,
             "input_sizes": [[2**62 + i * 64 + j for j in range(64)] for i in range(1000)],
             "input_dtypes": ["Float"], "output_sizes": [], "output_dtypes": []}
    assert summarise_in_python([entry], True) is None
    assert summarise([entry], True) is None
