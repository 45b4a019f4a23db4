"""The analysis's vocabularies (verdict word, culprit kind, membership source) and the one per-kind table."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fr_otel import analyze, build_job, read_dumps
from fr_otel.diagnosis.kinds import (
    KIND_ORDER,
    KINDS,
    NOT_BLAMED,
    CulpritKind,
    MembershipSource,
    VerdictWord,
    check_table,
)
from fr_otel.trace.attributes import bounded_value

README = Path(__file__).resolve().parents[2] / "README.md"


def _plain(doc: Any) -> Any:
    """``doc`` with every string subclass (an enum member) turned into an exact ``str``."""
    if isinstance(doc, dict):
        return {str.__str__(k) if isinstance(k, str) else k: _plain(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_plain(v) for v in doc]
    if isinstance(doc, str):
        return str.__str__(doc)
    return doc


def test_every_culprit_kind_has_one_row_ordered_strongest_first() -> None:
    """The table has a row for each kind and no other, and its orders rank them 0..n-1."""
    assert set(KINDS) == set(CulpritKind)
    assert [KINDS[k].order for k in KIND_ORDER] == list(range(len(CulpritKind)))
    assert KIND_ORDER[0] is CulpritKind.MISMATCH and NOT_BLAMED == {CulpritKind.UNKNOWN}


def test_a_table_missing_a_kind_fails_loudly_naming_it() -> None:
    """check_table raises, naming the kind without a row and the row without a kind."""
    partial = {k: v for k, v in KINDS.items() if k is not CulpritKind.STRAGGLER}
    with pytest.raises(RuntimeError, match=r"no row for kind\(s\) straggler"):
        check_table("t", CulpritKind, partial)
    with pytest.raises(RuntimeError, match="rows for no kind: stale"):
        check_table("t", CulpritKind, {**KINDS, "stale": None})


_NEW_KIND = r'''
import sys
import types
import fr_otel.common.str_enum as se
import fr_otel.diagnosis.kinds as kinds

class CulpritKind(se.StrEnum):
    MISMATCH = "mismatch"
    NOT_COMPLETED = "not_completed"
    NOT_ENQUEUED = "not_enqueued"
    MISSING_DUMP = "missing_dump"
    STRAGGLER = "straggler"
    UNKNOWN = "unknown"
    NEW_KIND = "new_kind"

kinds.CulpritKind = CulpritKind  # as if the member had been added to the enum, and no row anywhere
failed = []
for table in ("fr_otel.report.advice", "fr_otel.diagnosis.kinds"):
    try:
        if table == "fr_otel.diagnosis.kinds":
            src = open(kinds.__file__).read().replace(
                '    UNKNOWN = "unknown"\n', '    UNKNOWN = "unknown"\n    NEW_KIND = "new_kind"\n', 1)
            copy = sys.modules["fr_otel.diagnosis.kinds_copy"] = types.ModuleType("fr_otel.diagnosis.kinds_copy")
            copy.__package__ = "fr_otel.diagnosis"
            exec(compile(src, kinds.__file__, "exec"), copy.__dict__)
        else:
            __import__(table)
    except RuntimeError as exc:
        failed.append(str(exc))
print("\n".join(failed))
'''


def test_a_new_kind_without_its_rows_fails_the_first_import() -> None:
    """A kind added to the enum but not to the kinds table or the report's advice stops the import, naming it."""
    proc = subprocess.run([sys.executable, "-c", _NEW_KIND], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    assert lines[0].startswith("report.advice._STEPS: no row for kind(s) new_kind"), lines
    assert lines[1].startswith("diagnosis.kinds.KINDS: no row for kind(s) new_kind"), lines


def test_the_readme_kinds_table_lists_every_kind() -> None:
    """README's kinds table and its JSON schema name exactly the kinds of the enum."""
    text = README.read_text(encoding="utf-8")
    rows = text[text.index("| kind | meaning | evidence |"):]
    table = re.findall(r"^\| `([a-z_]+)` \|", rows[:rows.index("\n\n")], flags=re.M)
    assert sorted(table) == sorted(CulpritKind), table
    schema = text[text.index('"kind": "'):]
    schema = schema[:schema.index("# unknown")]
    assert sorted(re.findall(r'"([a-z_]+)"', schema)[1:]) == sorted(CulpritKind), schema


def test_enum_members_serialise_as_their_strings_in_json_and_span_attributes(nvrx: Path) -> None:
    """The NVRx verdict's JSON is byte-identical to the same document of plain strings, and a
    member sent as a span attribute is that plain string."""
    verdict = analyze(build_job(read_dumps(nvrx / "lock_gil_1st")))
    assert type(verdict.verdict) is VerdictWord and {type(c.kind) for c in verdict.culprits} == {CulpritKind}
    doc = verdict.to_dict()
    assert {type(g["membership"]) for g in doc["groups"]} == {MembershipSource}
    assert json.dumps(doc, separators=(",", ":")) == json.dumps(_plain(doc), separators=(",", ":"))
    for member in (VerdictWord.HANG, CulpritKind.NOT_ENQUEUED, MembershipSource.PG_CONFIG):
        sent = bounded_value(member)
        assert type(sent) is str and sent == member.value
    assert bounded_value([CulpritKind.MISMATCH, CulpritKind.UNKNOWN]) == ["mismatch", "unknown"]
