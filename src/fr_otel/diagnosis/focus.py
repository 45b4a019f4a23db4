"""What an incident is about: the collectives the report outlines, the trace marks and keeps.

One rule, read by the HTML report (the collectives it outlines as stuck), the trace (the spans it
marks in error, and the entries it keeps whatever the span budget) and nothing else deciding it
again: each culprit's collective first — the first culprit's first, a straggler's never, since a
straggler is slow, not stuck —, then each group's oldest collective in flight, groups some member
never entered before the rest, oldest first. Groups whose state the analysis could not judge (a
``note``) are not in it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .kinds import CulpritKind
from .verdict import Verdict

__all__ = ["Collective", "IncidentFocus", "incident_focus"]

Collective = tuple[str, int]  # (group name, collective sequence number)


@dataclass(frozen=True, slots=True)
class IncidentFocus:
    """The collectives an incident is about, most telling first."""

    of_culprits: tuple[Collective, ...]  # each stuck culprit's, in culprit order
    in_flight: tuple[Collective, ...]  # each judged group's oldest collective in flight, blocked first

    @property
    def main(self) -> tuple[Collective, ...]:
        """The ones a reader is shown first: the culprits', or, with none, the most blocked group's."""
        return self.of_culprits or self.in_flight[:1]

    @property
    def all(self) -> tuple[Collective, ...]:
        """Every one, without repeats, the culprits' first."""
        return tuple(dict.fromkeys((*self.of_culprits, *self.in_flight)))


def incident_focus(verdict: Verdict) -> IncidentFocus:
    """The collectives ``verdict`` is about (see the module's docstring for the order)."""
    of_culprits = dict.fromkeys(
        (c.group_name, c.collective_seq_id) for c in verdict.culprits
        if c.collective_seq_id is not None and c.kind != CulpritKind.STRAGGLER
    )
    judged = [(g.group.name, f) for g in verdict.groups if (f := g.in_flight) is not None and g.note is None]
    judged.sort(key=lambda gf: (not gf[1].not_entered, gf[1].since_ns or 0))
    return IncidentFocus(tuple(of_culprits), tuple((name, f.seq) for name, f in judged))
