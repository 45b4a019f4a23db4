"""Small pieces of the report's text and markup: escaping, clipping, durations, badges.

Everything a dump says is untrusted (file names, group descs, stack frames, ops): it goes
through :func:`esc` before it reaches the page, so there is one place to get that right.
"""

from __future__ import annotations

import html
import re

from ..common.text import clip
from ..diagnosis.kinds import KINDS, CulpritKind

__all__ = ["badge", "esc", "fmt_duration", "fmt_rel", "seq_label"]

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")




def esc(value: object, limit: int | None = None) -> str:
    """HTML-escape untrusted text (quotes included); control characters and lone
    surrogates (undecodable file names) become U+FFFD so the output is valid UTF-8."""
    text = value if isinstance(value, str) else str(value)
    if limit is not None:
        text = clip(text, limit)
    return html.escape(_CONTROL.sub("\ufffd", text), quote=True)


def fmt_duration(ns: float) -> str:
    """A positive duration for people: ``850 µs``, ``12 ms``, ``30.4 s``, ``4 min 10 s``, ``2 h 5 min``."""
    s = max(ns, 0) / 1e9
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 0.01:
        return f"{s * 1e3:.1f} ms"
    if s < 1:
        return f"{s * 1e3:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    if s < 86400 * 2:
        return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    return f"{s / 86400:.1f} days"


def fmt_rel(ns: float) -> str:
    """A time relative to the reference: ``−30.4 s`` (before it), ``0``, ``+2 ms``."""
    if ns == 0:
        return "0"
    return ("−" if ns < 0 else "+") + fmt_duration(abs(ns))


def badge(kind: CulpritKind) -> str:
    """A culprit kind as a coloured label (``never enqueued``, ``mismatch``…)."""
    return f'<span class="badge k-{esc(kind)}">{esc(KINDS[kind].label)}</span>'


def seq_label(seq: int | None) -> str:
    """``#26``, or a dash when the sequence number is unknown."""
    return f"#{seq}" if seq is not None else "—"

