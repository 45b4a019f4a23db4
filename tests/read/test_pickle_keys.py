"""A pickle whose dict keys all hash alike is refused before loading, in linear time."""

from __future__ import annotations

import os
import pickle
import pickletools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.hostile_dumps import nccl_dump
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.hostile_side_files import small_job

from fr_otel import analyze, build_job, read_dumps
from fr_otel.read import pickle_keys
from fr_otel.read.pickle_keys import key_problem, key_problem_in_python
from fr_otel.testing.dump_builder import DumpBuilder

P = (1 << 61) - 1  # CPython hashes an int to itself modulo P
DATA = Path(__file__).resolve().parents[1] / "data" / "nvrx-fr-traces"


def _text(value: str) -> bytes:
    raw = value.encode()
    return b"\x8c" + bytes((len(raw),)) + raw  # SHORT_BINUNICODE


def _dump_with_pg_status(keys: list[bytes]) -> bytes:
    """A dump whose pg_status has these (already pickled) keys, written opcode by opcode: building
    such a dict in order to pickle it would take the very quadratic time the test is about."""
    body = [b"\x80\x02}(", _text("version"), _text("2.10"), _text("entries"), b"]", _text("pg_status"), b"}"]
    for i in range(0, len(keys), 1000):  # SETITEMS batches of 1000, as pickle writes them
        body += [b"(", *(k + b"K\x00" for k in keys[i:i + 1000]), b"u"]
    return b"".join(body + [b"u."])


def hash_flood(n: int = 90_000) -> bytes:
    """A hash flood: one dict whose int keys all hash to 0 (``k * (2**61 - 1)``), ~1.1 MB."""
    keys = []
    for k in range(1, n):
        raw = (k * P).to_bytes((k * P).bit_length() // 8 + 1, "little", signed=True)
        keys.append(b"\x8a" + bytes((len(raw),)) + raw)  # LONG1
    return _dump_with_pg_status(keys)


def tuple_flood(bits: int = 17) -> bytes:
    """No big int at all: tuples of -1 and -2 (both hash to -2), 2**17 keys of one hash."""
    small = {-1: b"J" + (-1).to_bytes(4, "little", signed=True), -2: b"J" + (-2).to_bytes(4, "little", signed=True)}
    return _dump_with_pg_status([b"(" + b"".join(small[-1 - ((i >> b) & 1)] for b in range(bits)) + b"t"
                                 for i in range(1 << bits)])


@pytest.mark.parametrize("make", [hash_flood, tuple_flood], ids=["k*(2**61-1)", "tuples of -1/-2"])
def test_a_hash_flooding_dump_is_one_line_in_under_two_seconds(tmp_path: Path, make: Any) -> None:
    """A 1.1 MB hash flood (27 s to unpickle as such): the file is refused before loading
    (one line), and the other ranks are analysed, all in under 2 s of CPU."""
    folder = small_job(tmp_path)
    victim = folder / "nccl_trace_rank_1"
    victim.write_bytes(make())
    assert victim.stat().st_size > 1_000_000
    started = time.process_time()
    read = read_dumps(folder, workers=1)
    verdict = analyze(build_job(read))
    assert time.process_time() - started < 2
    assert [p for p in read.problems if str(victim) in p] == [
        f"{victim}: unsafe pickle: refuses a dict key that is not a string or a small integer (SETITEMS; dumps "
        "key their dicts by strings and small integers, and others can make loading take quadratic time); "
        "nothing was run"]
    assert set(read.dumps) == {0, 2, 3} and 3 in [c.rank for c in verdict.culprits]


def test_a_set_in_a_dump_is_refused() -> None:
    """Dumps hold no sets; a set of colliding ints floods as a dict does."""
    assert key_problem(pickle.dumps({"entries": [], "x": {k * P for k in range(3)}}, protocol=4)).startswith("a set")


def test_real_dumps_and_int_keyed_pg_status_pass() -> None:
    """The real NCCL fixtures, builder dumps and a pg_status keyed by int pg ids (as torch pickles
    it) are not refused: only keys no dump has are."""
    files = [p for p in sorted(DATA.glob("*/*")) if p.is_file() and p.read_bytes()[:1] == b"\x80"]
    assert len(files) > 10
    for path in files:
        assert key_problem(path.read_bytes()) is None, path
    b = DumpBuilder(2)
    world = b.group("0", "default_pg", range(2))
    for _ in range(50):
        b.collective(world)
    assert key_problem(b.dump(0)) is None
    doc = nccl_dump(1)
    doc["pg_status"] = {0: doc["pg_status"]["0"], 7: doc["pg_status"]["0"], P - 1: {}, -(P - 1): {}, True: {}}
    assert key_problem(pickle.dumps(doc, protocol=2)) is None


def test_a_memo_index_no_pickler_writes_is_refused_as_memory() -> None:
    """LONG_BINPUT 2**27 in a 15-byte file (the memo bomb) is refused before any allocation."""
    bomb = b"\x80\x02N" + b"r" + (2**27).to_bytes(4, "little") + b"." + b"\x00" * 6
    assert key_problem(bomb) == pickle_keys.MEMO_PROBLEM


def test_the_compiled_walk_is_built_and_in_use() -> None:
    """scripts/setup.sh builds it; FR_OTEL_PURE_PYTHON=1 turns it off."""
    assert pickle_keys.COMPILED, "fr_otel.read._pickle_keys was not built: reinstall with a C compiler"
    code = "from fr_otel.read import pickle_keys; print(pickle_keys.COMPILED)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "FR_OTEL_PURE_PYTHON": "1"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_walk_is_a_small_part_of_the_load() -> None:
    """On a 2000-entry dump the C walk costs well under the load itself (best of 7)."""
    b = DumpBuilder(2)
    world = b.group("0", "default_pg", range(2))
    for _ in range(2000):
        b.collective(world)
    data = b.dump(0)

    def best(f: Any) -> float:
        times = []
        for _ in range(7):
            began = time.perf_counter()
            f(data)
            times.append(time.perf_counter() - began)
        return min(times)

    assert best(key_problem) < 0.25 * best(pickle.loads)


# --------------------------------------------------------------------------- the C walk is the reference's

_key = st.one_of(st.text(max_size=3), st.integers(), st.binary(max_size=2), st.booleans(), st.none(),
                 st.floats(allow_nan=False), st.tuples(st.integers(-3, 3), st.integers(-3, 3)),
                 st.sampled_from([P, -P, P - 1, 1 - P, 2**63, -(2**63), 2**64, -1, -2]))
_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4), st.binary(max_size=4))
_plain = st.recursive(_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner), st.dictionaries(_key, inner, max_size=4),
    st.frozensets(st.integers(-3, 3), max_size=3)), max_leaves=20)


def _truth(value: Any) -> bool:
    """Does ``value`` hold a dict with a key that is not str/bytes/bool/an int below 2**61 - 1?"""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            for k, item in v.items():
                if not (isinstance(k, (str, bytes)) or isinstance(k, int) and -P < k < P):
                    return True
                todo.append(item)
        elif isinstance(v, (list, tuple, frozenset)):
            todo.extend(v)
    return False


def _has_set(value: Any) -> bool:
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, frozenset):
            return True
        if isinstance(v, dict):
            todo.extend(v.values())
        elif isinstance(v, (list, tuple)):
            todo.extend(v)
    return False


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_plain, protocol=st.integers(2, 5))
def test_the_walk_refuses_exactly_the_dicts_keyed_by_what_dumps_never_use(value: Any, protocol: int) -> None:
    """On any plain object pickled with protocol 2-5: C and Python agree, and (where no global
    stops the loader first) refuse exactly when a dict has a key other than str/bytes/bool/small
    int, or a set is there."""
    data = pickle.dumps(value, protocol=protocol)
    answer = key_problem_in_python(data)
    assert key_problem(data) == answer
    if any(op.name in ("GLOBAL", "STACK_GLOBAL") for op, _, _ in pickletools.genops(data)):
        return  # bytes before protocol 3, sets before 4: the loader refuses the global, the walk stops there
    assert (answer is not None) == (_truth(value) or _has_set(value)), (value, answer)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_plain, protocol=st.integers(0, 5), cut=st.integers(0, 400), flips=st.lists(
    st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4))
def test_the_c_walk_answers_as_the_reference_on_broken_pickles(value: Any, protocol: int, cut: int,
                                                               flips: list[tuple[int, int]]) -> None:
    """Truncated pickles, flipped bytes, protocol 0's text opcodes: the same answer, no crash."""
    data = bytearray(pickle.dumps(value, protocol=protocol))
    for at, byte in flips:
        if data:
            data[at % len(data)] = byte
    data = bytes(data[: max(cut, 1)]) if cut < len(data) else bytes(data)
    assert key_problem(data) == key_problem_in_python(data)
