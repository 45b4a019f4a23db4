"""One-line, printable messages: every problem fr-otel reports is a single safe line, never a traceback.

Dumps, file names and environment variables are untrusted: a newline in a file name
must not forge a "HEALTHY" line, ``ESC[2J`` must not clear the terminal, and a lone
surrogate (a non-UTF-8 file name, a hostile JSON string) must not make an encoder
raise. :func:`printable` escapes exactly those characters, leaving ordinary text alone.
"""

from __future__ import annotations

import logging

__all__ = ["MAX_ATTRIBUTE_CHARS", "PrintableFormatter", "clip", "one_line", "printable"]

#: The longest string any span attribute fr-otel sends may be (Tempo truncates beyond 2048 bytes
#: by default): the trace's own attributes and the root attributes read from incident.json alike.
MAX_ATTRIBUTE_CHARS = 2000


def clip(text: str, limit: int) -> str:
    """At most ``limit`` characters, an ellipsis saying when it was cut: dumps may hold huge strings."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by os.fsdecode's surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, *, keep_lines: bool = False) -> str:
    """``text`` with every character Python does not call printable escaped (``\\x1b``,
    ``\\u202e``): controls, lone surrogates, bidi and other format characters, line
    separators and unassigned code points, which a terminal may show as anything or nothing.

    ``keep_lines`` leaves newlines and tabs alone (multi-line values such as a stack).
    """
    if text.isprintable():
        return text
    kept = "\n\t" if keep_lines else ""
    return "".join(c if c.isprintable() or c in kept else _escape(c) for c in text)


def one_line(value: object, limit: int = 300) -> str:
    """``value`` (text or an exception) flattened to one printable line of at most ``limit`` characters."""
    if isinstance(value, BaseException):
        value = str(value) or type(value).__name__
    return clip(printable(" ".join(str(value).split())), limit)


class PrintableFormatter(logging.Formatter):
    """Log lines with file names and dump text in them, escaped: one record is one terminal line."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))
