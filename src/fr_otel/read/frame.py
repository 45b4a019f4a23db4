"""One Python stack frame, and whose code it is: what entries' call sites and live stacks are made of.

Its own module so both :mod:`fr_otel.read.dump` (entries) and :mod:`fr_otel.read.live_stack`
(threads at incident time) stand on it without importing each other. Which frame is "the
user's code" is decided here only (:func:`frame_origin`): the verdict's last call site, the
live "where is it now", the trace's ``code.*`` attributes and the report's dimmed frames
all ask this one rule.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

__all__ = ["Frame", "FrameOrigin", "frame_origin", "is_user_frame"]

FrameOrigin = Literal["torch", "stdlib", "lib", "user"]

_INSTALLED = ("/site-packages/", "/dist-packages/")
_STDLIB = re.compile(r"/lib/python3(\.\d+)?/")


class Frame(NamedTuple):
    """One Python stack frame of the call that enqueued a collective."""

    name: str
    filename: str
    line: int


def frame_origin(filename: str) -> FrameOrigin:
    """``torch`` (inside torch), ``stdlib`` (the standard library, generated code), ``lib`` (another
    installed package) or ``user``. Training code installed as a package (Megatron, NeMo) is ``lib``
    for the report's dimming but still the user's code (:func:`is_user_frame`)."""
    path = filename.replace("\\", "/")
    if "/torch/" in path:
        return "torch"
    if any(m in path for m in _INSTALLED):
        return "lib"
    if path.startswith("<") or _STDLIB.search(path):
        return "stdlib"
    return "user"


def is_user_frame(filename: str) -> bool:
    """Not torch, not the standard library: where the application's own code runs."""
    return frame_origin(filename) in ("lib", "user")
