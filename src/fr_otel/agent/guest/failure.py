"""Which collectives a failure ended: the backend records them as completed, the agent knows better.

When a gloo collective times out or its peer goes away, ``wait()`` raises in the training thread
and gloo retires the entry as if it had completed; NCCL's watchdog abort does the same. The
exception is the only witness. So at an uncaught exception that is a collective failure (a
``torch.distributed`` error, or gloo's and NCCL's own words), the agent marks as failed the
collective the training thread was waiting in (the newest one it enqueued) and every collective
it saw in flight at its last poll that the recorder now shows completed. The marks travel with
the payload (:mod:`fr_otel.read.failed`), so the verdict sees them in flight, as they were.
"""

from __future__ import annotations

import re
import time
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

from ...common.text import one_line
from ...read.failed import MAX_MARKS, FailedCollective
from ...read.rank_facts import ExitRecord
from ...read.entry_rules import completion_rule
from ..observe.recorder import recorder_entries

__all__ = ["collective_failure", "exit_record", "failed_collectives", "failed_in_recorder"]

_FAILURE_WORDS = re.compile(
    r"gloo/transport|Connection (?:closed|reset) by peer|Timed out waiting \d+ms|NCCL (?:error|communicator)|"
    r"[Ww]atchdog caught collective operation timeout|ProcessGroup\w* (?:is )?abort", re.ASCII)


def collective_failure(exc: BaseException) -> str | None:
    """One line saying why, when ``exc`` is a collective that failed (not a bug in the training code)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = one_line(exc, 300)
    if names & {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"} or _FAILURE_WORDS.search(text):
        return f"{type(exc).__name__}: {text}"
    return None


def failed_collectives(entries: Iterable[Mapping[str, Any]], in_flight: Mapping[str, int],
                       reason: str) -> tuple[FailedCollective, ...]:
    """The collectives ``reason`` ended, from this rank's recorder ``entries`` (oldest first): the newest
    collective, and each of ``in_flight`` (group -> seq seen in flight before) when recorded as completed."""
    newest: Mapping[str, Any] | None = None
    completed: dict[tuple[str, int], bool] = {}
    entries = list(entries)
    entry_completed = completion_rule(entries)
    for e in entries:
        try:
            if e.get("is_p2p"):
                continue
            key = (str(e["process_group"][0]), int(e["collective_seq_id"]))
        except (KeyError, TypeError, ValueError, IndexError):
            continue
        completed[key] = entry_completed(e)
        newest = e
    marks: dict[tuple[str, int], FailedCollective] = {}
    if newest is not None:
        # The one the exception came from, marked even while the recorder still shows it pending: the backend
        # may retire it as completed only after ``wait()`` raised, and a part read then would show it done.
        key = (str(newest["process_group"][0]), int(newest["collective_seq_id"]))
        marks[key] = FailedCollective(*key, reason)
    for group, seq in in_flight.items():
        if completed.get((group, seq)):
            marks.setdefault((group, seq), FailedCollective(group, seq, reason))
    return tuple(marks.values())[:MAX_MARKS]


def failed_in_recorder(raw: bytes, leaving: ExitRecord | None) -> tuple[FailedCollective, ...]:
    """The marks a collective's failure implies, read from this process's own recorder bytes, when its exit
    record says a collective failed: a part taken between the exception and the exception hook's own marks
    (the hook reads the recorder too, and a joined incident's part may be built meanwhile) must not show the
    failed collective as completed."""
    if leaving is None or leaving.how != "failure":
        return ()
    return failed_collectives(recorder_entries(raw), {}, f"{leaving.type}: {leaving.message}"[:300])


def exit_record(exc: BaseException) -> ExitRecord:
    """How an uncaught exception ends this rank: its type, message and the innermost frame it was raised in
    (what the others' cause says once this process is gone); a collective's failure is told apart (a hang's
    aftermath, not its cause)."""
    where = ""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
    if frames:
        f = frames[-1]
        where = f"{f.filename}:{f.lineno} in {f.name}"
    how = "failure" if collective_failure(exc) is not None else "exception"
    return ExitRecord(how, type(exc).__name__, one_line(exc, 300), where, at_ns=time.time_ns())
