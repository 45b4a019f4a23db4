"""Dumps of two incidents in one folder: a restarted job that dumped to the same path again.

NCCL writes a rank's dump to the same file name at every incident (``TORCH_FR_DUMP_TEMP_FILE``
plus the rank), so a job that hung, restarted and hung again leaves a folder where some ranks'
files are the second incident's and the rest the first's. Analysed together they describe no
real moment. The sign is a rank that recorded collectives well after another rank's dump was
written: within one incident nobody runs collectives minutes after the dumps (they are written
because the job is stuck). A culprit stuck for an hour is no such sign: its activity is old,
not new.
"""

from __future__ import annotations

from ..common.clock import format_clock
from ..common.ranks import compress_ranks
from ..read.dump import RankDump
from .pace import dumped_at_ns

__all__ = ["GAP_S", "mixed_incidents"]

#: Activity this long after the first dump was written is another incident's (clock skew
#: between hosts and the last ranks still finishing stay far below it).
GAP_S = 60.0


def mixed_incidents(dumps: dict[int, RankDump]) -> str | None:
    """One line when the dumps seem to come from different incidents, else None."""
    written = {r: t for r, d in dumps.items() if (t := dumped_at_ns(d)) is not None}
    if not written:
        return None
    first = min(written.values())
    bound = first + int(GAP_S * 1e9)
    later = sorted(r for r, d in dumps.items() if d.latest_ns > bound)
    earlier = sorted(r for r, t in written.items() if t <= bound and r not in later)
    if not later or not earlier:
        return None
    newest = max(dumps[r].latest_ns for r in later)
    return (f"these dumps seem to come from different incidents: rank(s) {compress_ranks(earlier)} were dumped "
            f"at {format_clock(first)}, but rank(s) {compress_ranks(later)} recorded collectives until "
            f"{format_clock(newest)}, {(newest - first) / 60e9:.0f} min later (a restarted job dumping to the same "
            "folder?); analyse each incident's dumps on their own (the files' times tell them apart)")
