"""One-line, printable messages: every problem fr-otel reports is a single safe line, never a traceback.

Dumps, file names and environment variables are untrusted: a newline in a file name
must not forge a "HEALTHY" line, ``ESC[2J`` must not clear the terminal, and a lone
surrogate (a non-UTF-8 file name, a hostile JSON string) must not make an encoder
raise. :func:`printable` escapes exactly those characters, leaving ordinary text alone.
"""

from __future__ import annotations

import logging
import re

__all__ = ["PrintableFormatter", "one_line", "printable"]

# C0/C1 controls and DEL, lone surrogates, line/paragraph separators and the bidi
# controls that reorder what a terminal shows.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by os.fsdecode's surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_UNSAFE_BUT_LINES = re.compile(_UNSAFE.pattern.replace("\x00-\x1f", "\x00-\x08\x0b-\x1f"))


def printable(text: str, *, keep_lines: bool = False) -> str:
    """``text`` with control characters, lone surrogates and bidi controls escaped (``\\x1b``).

    ``keep_lines`` leaves newlines and tabs alone (multi-line values such as a stack).
    """
    if text.isprintable():
        return text
    return (_UNSAFE_BUT_LINES if keep_lines else _UNSAFE).sub(_escape, text)


def one_line(value: object, limit: int = 300) -> str:
    """``value`` (text or an exception) flattened to one printable line of at most ``limit`` characters."""
    if isinstance(value, BaseException):
        value = str(value) or type(value).__name__
    flat = printable(" ".join(str(value).split()))
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class PrintableFormatter(logging.Formatter):
    """Log lines with file names and dump text in them, escaped: one record is one terminal line."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))
