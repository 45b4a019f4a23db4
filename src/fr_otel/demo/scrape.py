"""The culprit as the ranks' ``/metrics`` show it, scraped while the job is stuck.

Each rank's endpoint is read once (bounded), parsed with prometheus_client's own parser, and the
samples are judged by the rule the PromQL culprit query states
(:func:`fr_otel.common.promql.culprit_query`): in each process group whose members disagree and
whose oldest collective has been in flight longer than the threshold, the rank(s) with the lowest
last enqueued sequence number are the ones the others wait for. Prometheus runs that query over
the same series; the demo prints it beside what it found here.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from ..common.text import one_line

__all__ = ["GroupBlame", "Scrape", "Series", "scrape"]

ENQUEUED = "fr_last_enqueued_seq"
AGE = "fr_inflight_collective_age_seconds"
_MAX_BYTES = 4 << 20


@dataclass(frozen=True)
class Series:
    """One sample of one rank's /metrics."""

    name: str
    labels: tuple[tuple[str, str], ...]  # sorted by name
    value: float

    def label(self, key: str) -> str:
        return next((v for k, v in self.labels if k == key), "")

    @property
    def rank(self) -> int | None:
        text = self.label("rank")
        return int(text) if text.isdigit() else None

    def text(self) -> str:
        """As the exposition format writes it: ``name{k="v",...} value``."""
        labels = ",".join(f'{k}="{v}"' for k, v in self.labels)
        return f"{self.name}{{{labels}}} {self.value:g}"


@dataclass(frozen=True)
class GroupBlame:
    """One process group as the metrics show it: how far each rank enqueued, the oldest wait, who is blamed."""

    pg_name: str
    pg_desc: str
    enqueued: dict[int, int]  # rank -> last enqueued sequence number
    oldest_age_s: float  # the oldest collective in flight on any member
    op: str  # that collective's op ("" until the agent's full read named it)
    culprits: tuple[int, ...]  # the lowest enqueued, when the group waits past the threshold


@dataclass(frozen=True)
class Scrape:
    """Every rank's fr_* samples from one round of scrapes, and the ranks that did not answer."""

    series: tuple[Series, ...]
    failed: dict[int, str]  # rank -> why its /metrics could not be read

    def by_rank(self, name: str) -> dict[int, float]:
        """``name``'s value per rank (for per-rank series such as fr_training_step)."""
        return {s.rank: s.value for s in self.series if s.name == name and s.rank is not None}

    def blame(self, threshold_s: float) -> list[GroupBlame]:
        """Per process group, the culprit query's answer over these samples."""
        groups: dict[str, list[Series]] = {}
        for s in self.series:
            if s.name in (ENQUEUED, AGE) and s.rank is not None:
                groups.setdefault(s.label("pg_name"), []).append(s)
        out = []
        for name, samples in sorted(groups.items()):
            enqueued = {s.rank: int(s.value) for s in samples if s.name == ENQUEUED and s.rank is not None}
            ages = [s for s in samples if s.name == AGE]
            oldest = max(ages, key=lambda s: s.value, default=None)
            age = oldest.value if oldest is not None else 0.0
            low = min(enqueued.values(), default=0)
            stuck = bool(enqueued) and low != max(enqueued.values()) and age > threshold_s
            out.append(GroupBlame(name, samples[0].label("pg_desc"), enqueued, age,
                                  oldest.label("op") if oldest is not None else "",
                                  tuple(sorted(r for r, v in enqueued.items() if v == low)) if stuck else ()))
        return out

    def of_group(self, pg_name: str) -> list[Series]:
        """The group's progress and in-flight series, ranks in order."""
        return sorted((s for s in self.series if s.name in (ENQUEUED, AGE) and s.label("pg_name") == pg_name),
                      key=lambda s: (s.name != ENQUEUED, s.rank or 0))


def scrape(urls: Mapping[int, str], timeout_s: float = 2.0) -> Scrape:
    """Read each rank's /metrics once (at most ``timeout_s`` each); a rank that does not answer is
    named with why, never an exception."""
    from prometheus_client.parser import text_string_to_metric_families

    series: list[Series] = []
    failed: dict[int, str] = {}
    for rank, url in sorted(urls.items()):
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                text = resp.read(_MAX_BYTES).decode("utf-8", "replace")
            families = list(text_string_to_metric_families(text))
        except (OSError, ValueError, urllib.error.URLError) as exc:
            failed[rank] = one_line(exc)
            continue
        series.extend(Series(s.name, tuple(sorted(s.labels.items())), float(s.value))
                      for f in families for s in f.samples if s.name.startswith("fr_"))
    return Scrape(tuple(series), failed)
