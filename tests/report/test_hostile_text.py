"""Hostile text in a dump reaches the terminal verdict escaped: only characters a terminal prints as themselves."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.hostile_dumps import VICTIM, everything, nccl_dump, write_job

from fr_otel.report.text import render_verdict


@pytest.mark.parametrize("odd", ["\ud7fc", "\u200b", "\u00a0", "\U000e0001", "\u0600"])
def test_unassigned_and_format_characters_in_a_version_are_escaped_in_the_text_report(
        tmp_path: Path, odd: str) -> None:
    """An unassigned code point, a zero-width space, a no-break space, a tag character or an
    Arabic number sign in the dump's version reaches the text report escaped: the verdict shows
    only characters a terminal prints as themselves (Hypothesis found U+D7FC getting through)."""
    doc = nccl_dump(VICTIM)
    doc["version"] = f"2.{odd}10"
    folder = write_job(tmp_path / "d", doc)
    job, verdict, _ = everything(folder)
    text = render_verdict(verdict)
    assert all(c.isprintable() or c == "\n" for c in text), repr(text)
    escaped = f"\\u{ord(odd):04x}" if ord(odd) < 0x10000 else f"\\U{ord(odd):08x}"
    if ord(odd) < 0x100:
        escaped = f"\\x{ord(odd):02x}"
    assert f"2.{escaped}10" in text, repr(text)  # shown, escaped: not dropped
