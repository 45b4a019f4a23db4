"""Data links: from a table cell to the incident traces in Tempo, or to a rank's drill-down.

Gauges cannot carry exemplars, so tables reach traces through links (a TraceQL search over the
span attributes of ``fr_otel.trace.attributes``, the contract the exporter writes) and the rank
dashboard through its URL with the current variables and time range.
"""

from __future__ import annotations

import json
import re
from urllib.parse import quote

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import dashboard as dm

from fr_otel.trace import attributes as A

# Grafana's built-in variables a link may carry (they are substituted, never URL-encoded).
_VARIABLE = re.compile(r"\$\{[^}]*\}")

#: The rank drill-down's uid and title (rank.py builds it; links need its URL slug).
RANK_UID = "fr-otel-rank"
RANK_TITLE = "fr-otel / Rank drill-down"


class DataLink(cogbuilder.Builder[dm.DashboardLink]):
    """A panel or field link: title and URL only.

    The SDK types panel links as dashboard links (tags, dropdown, ...); Grafana's panel and field
    links are plain ``{title, url}``, which is what this builds."""

    def __init__(self, title: str, url: str) -> None:
        self._link = _PlainLink(title=title, url=url)

    def build(self) -> dm.DashboardLink:
        return self._link


class _PlainLink(dm.DashboardLink):
    def to_json(self) -> dict[str, object]:
        return {"title": self.title, "url": self.url}


def spanset(*conditions: str) -> str:
    """A TraceQL spanset: ``{ a && b }``."""
    return "{ " + " && ".join(conditions) + " }"


def span(attribute: str, op: str, value: str) -> str:
    """One TraceQL condition on a span attribute of the contract."""
    return f"span.{attribute} {op} {value}"


#: Incident root spans that carry a verdict: every incident trace.
INCIDENT = (span(A.SPAN_ROLE, "=", '"incident"'), span(A.VERDICT, "!=", "nil"))


def _explore_url(traceql: str) -> str:
    """Grafana Explore on the ``$tempo`` data source with a TraceQL search over the dashboard's range."""
    state = {
        "datasource": "${tempo}",
        "queries": [{"refId": "A", "datasource": {"type": "tempo", "uid": "${tempo}"}, "queryType": "traceql",
                     "limit": 20, "tableType": "traces", "query": traceql}],
        "range": {"from": "${__from}", "to": "${__to}"},
    }
    raw = json.dumps(state, separators=(",", ":"))
    encoded = quote(raw, safe="")
    for variable in set(_VARIABLE.findall(raw)):  # Grafana substitutes these before opening the URL
        encoded = encoded.replace(quote(variable, safe=""), variable)
    return "/explore?orgId=1&left=" + encoded


def all_incidents() -> DataLink:
    """Every incident trace in the dashboard's range."""
    return DataLink("All incident traces (Tempo)", _explore_url(spanset(*INCIDENT)))


def incidents_blaming(rank_field: str = "${__data.fields.rank}") -> DataLink:
    """Incident traces whose verdict names the rank of this row as a culprit."""
    culprit = spanset(span(A.SPAN_ROLE, "=", '"rank"'), span(A.IS_CULPRIT, "=", "true"),
                      span(A.RANK, "=", rank_field))
    return DataLink(f"Incident traces blaming rank {rank_field} (Tempo)",
                    _explore_url(f"{spanset(*INCIDENT)} && {culprit}"))


def incidents_in_group(group_field: str = "${__data.fields.pg_name}") -> DataLink:
    """Incident traces about the process group of this row."""
    return DataLink(f"Incident traces in group {group_field} (Tempo)",
                    _explore_url(spanset(*INCIDENT, span(A.PG_NAME, "=", f'"{group_field}"'))))


def slug(title: str) -> str:
    """The URL slug Grafana derives from a dashboard title."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def rank_drilldown(rank_field: str = "${__data.fields.rank}") -> DataLink:
    """The rank dashboard for the rank of this row, keeping data sources, job filters and time range."""
    keep = "&".join(f"${{{name}:queryparam}}" for name in ("datasource", "tempo", "job", "training_job"))
    return DataLink(f"Rank {rank_field} drill-down",
                    f"/d/{RANK_UID}/{slug(RANK_TITLE)}?{keep}&var-rank={rank_field}&${{__url_time_range}}")


def rank_links() -> list[DataLink]:
    """What a rank cell offers: the traces that blame it, then its drill-down."""
    return [incidents_blaming(), rank_drilldown()]
