"""The shipped rules file with some of its numbers lowered, for tests that cannot wait for production's.

Each threshold is one recording rule (``- record: threshold:...`` / ``expr: vector(N)``) and each
alert's delay its ``for:``: lowering them here moves when the alerts fire and what their
annotations print, exactly as an operator lowering them would. Everything else, comments
included, stays byte for byte, so a test that loads the result runs the shipped rules. The
promtool test (tests/operate/test_operate_static.py) and the tests that run a real Prometheus load it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["EVERY_ALERT", "RULES_FILE", "groupings", "lowered_rules", "write_lowered_rules"]

RULES_FILE = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "fr-otel-rules.yml"
#: A key of ``fors`` that sets the ``for:`` of every alert without one of its own in ``fors``.
EVERY_ALERT = "*"

_ALERT = re.compile(r"\s*- alert: (\S+)\s*$")
_RECORD = re.compile(r"\s*- record: ")
_FOR = re.compile(r"^(\s+for: )\S+(\s*)$")
_GROUPING = re.compile(r"\b(?:by|on)\s*\(([^)]*)\)")


def groupings(expr: str) -> list[tuple[str, ...]]:
    """The labels of every ``by (...)`` and ``on(...)`` in a PromQL expression, in order."""
    return [tuple(label.strip() for label in clause.split(",") if label.strip()) for clause in _GROUPING.findall(expr)]


def _lower_thresholds(text: str, thresholds: Mapping[str, float | str]) -> str:
    for name, value in thresholds.items():
        text, n = re.subn(rf"(- record: {re.escape(name)}\n\s+expr: )vector\([^)]*\)", rf"\g<1>vector({value})", text)
        if n != 1:
            raise ValueError(f"{RULES_FILE.name}: {n} threshold rules named {name}, expected one")
    return text


def _lower_fors(text: str, fors: Mapping[str, str]) -> str:
    lines, alert, seen = text.splitlines(keepends=True), None, set()
    for i, line in enumerate(lines):
        if m := _ALERT.match(line):
            alert = m.group(1)
        elif _RECORD.match(line):
            alert = None
        elif alert is not None and (m := _FOR.match(line)):
            value = fors.get(alert, fors.get(EVERY_ALERT))
            if value is not None:
                lines[i] = f"{m.group(1)}{value}{m.group(2)}"
                seen.add(alert)
    missing = set(fors) - seen - {EVERY_ALERT}
    if missing:
        raise ValueError(f"{RULES_FILE.name}: no alert with a for: named {', '.join(sorted(missing))}")
    return "".join(lines)


def lowered_rules(thresholds: Mapping[str, float | str] | None = None, fors: Mapping[str, str] | None = None,
                  text: str | None = None) -> str:
    """The rules (``text``, else the shipped file) with each ``threshold:*`` rule of ``thresholds``
    set to ``vector(value)`` and each alert of ``fors`` given that ``for:`` (:data:`EVERY_ALERT`: the
    rest). A name that is not there is a ValueError, so a renamed rule cannot go unnoticed."""
    text = RULES_FILE.read_text(encoding="utf-8") if text is None else text
    return _lower_fors(_lower_thresholds(text, thresholds or {}), fors or {})


def write_lowered_rules(folder: Path, thresholds: Mapping[str, float | str] | None = None,
                        fors: Mapping[str, str] | None = None) -> Path:
    """:func:`lowered_rules` written to ``folder / fr-otel-rules.yml`` (the shipped name, which the
    promtool tests' ``rule_files`` name); returns that path."""
    path = folder / RULES_FILE.name
    path.write_text(lowered_rules(thresholds, fors), encoding="utf-8")
    return path
