"""What each verdict word means, in one place for the text verdict and the HTML page.

Both renderings open with the verdict; keeping the word, its short gloss and its one-line
meaning together means a new verdict kind (or a reworded one) cannot drift between them.
"""

from __future__ import annotations

from typing import NamedTuple

from ..diagnosis.kinds import VerdictWord, check_table

__all__ = ["Headline", "headline"]


class Headline(NamedTuple):
    """How a verdict is announced."""

    word: str  # "Hang": the page's headline, upper-cased in titles and on the terminal
    gloss: str  # the text verdict's short explanation after the word ("" when the word says it all)
    meaning: str  # one sentence under the page's headline

    @property
    def terminal(self) -> str:
        """The word upper-cased with its gloss: ``DESYNC (ranks disagree on a collective)``."""
        return self.word.upper() + (f" ({self.gloss})" if self.gloss else "")


_HEADLINES: dict[str, Headline] = {
    VerdictWord.HANG: Headline("Hang", "", "ranks are blocked in a collective that some rank never finishes"),
    VerdictWord.DESYNC: Headline(
        "Desync", "ranks disagree on a collective",
        "ranks disagree on a collective (different op, sizes or dtypes at the same sequence number)"),
    VerdictWord.STRAGGLER: Headline(
        "Straggler", "no hang; a rank is consistently late", "no collective is stuck, but a rank is consistently late"),
    VerdictWord.HEALTHY: Headline(
        "Healthy", "no collective stuck, no mismatch, no straggler",
        "no collective stuck, no mismatch, no straggler in the recorded window"),
    VerdictWord.INCONCLUSIVE: Headline("Inconclusive", "", "the dumps do not single out a rank"),
    VerdictWord.FAILURE: Headline(
        "Failure", "the job's own code raised and the job ended",
        "a rank's own code raised an exception and the job ended: nothing hangs"),
}


check_table("report.headline._HEADLINES", VerdictWord, _HEADLINES)


def headline(verdict: str) -> Headline:
    """The headline of ``verdict`` (an unknown word stands for itself, with no gloss)."""
    return _HEADLINES.get(verdict) or Headline(verdict, "", "")
