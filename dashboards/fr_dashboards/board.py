"""The frame every fr-otel dashboard shares: identity, variables, annotations, links and layout.

A :class:`Board` lays panels out row by row (the SDK flows them left to right, 24 columns wide),
lets stat panels only into the row on top, numbers the panels, and writes classic dashboard
JSON with ``"id": null`` (file provisioning assigns the id) and a stable ``uid``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import stat as stat_builder
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from .kit import PROMETHEUS, check_ranges

#: Classic dashboard JSON as Grafana 10.4 writes it; Grafana 10 to 12 load and migrate it.
SCHEMA_VERSION = 39
TAG = "fr-otel"
#: Matches a missing label too, so "All" keeps series without ``training_job``.
ALL = ".*"


class WithFields(cogbuilder.Builder[Any]):
    """An SDK builder's result plus JSON fields its schema does not model but Grafana reads
    (a query variable's ``definition``, a Prometheus annotation's ``titleFormat``...)."""

    def __init__(self, inner: cogbuilder.Builder[Any], fields: Mapping[str, object]) -> None:
        self._inner, self._fields = inner, dict(fields)

    def build(self) -> _Fields:
        return _Fields(self._inner.build(), self._fields)


class _Fields:
    def __init__(self, model: Any, fields: dict[str, object]) -> None:
        self._model, self._fields = model, fields

    def to_json(self) -> dict[str, object]:
        return {**self._model.to_json(), **self._fields}


# ------------------------------------------------------------------------------------------------
# variables
# ------------------------------------------------------------------------------------------------
def datasource_variable(name: str, label: str, plugin: str) -> WithFields:
    """Pick a data source of type ``plugin``: panels use ``${name}``, so provisioning needs no uid."""
    variable = (db.DatasourceVariable(name).label(label).type(plugin).hide(dm.VariableHide.DONT_HIDE)
                .multi(False).include_all(False).regex(""))
    return WithFields(variable, {"current": {}, "options": [], "refresh": int(dm.VariableRefresh.ON_DASHBOARD_LOAD)})


def query_variable(name: str, label: str, query: str, *, multi: bool = True,
                   sort: dm.VariableSort = dm.VariableSort.ALPHABETICAL_ASC) -> WithFields:
    """Values of a label (``label_values(selector, label)``), refreshed with the time range.
    A multi-value variable also offers All, which matches a missing label too."""
    variable = (db.QueryVariable(name).label(label).datasource(PROMETHEUS).query(query)
                .hide(dm.VariableHide.DONT_HIDE).include_all(multi).multi(multi).options([])
                .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).regex("").sort(sort))
    if multi:
        variable = variable.all_value(ALL)
    return WithFields(variable, {"definition": query, "current": {}})


def textbox_variable(name: str, label: str) -> db.TextBoxVariable:
    """Free text, empty by default (a trace id pasted from a table or an exemplar)."""
    return (db.TextBoxVariable(name).label(label).default_value("").hide(dm.VariableHide.DONT_HIDE)
            .current(dm.VariableOption(text="", value="")).options([]))


def job_variables() -> list[cogbuilder.Builder[Any]]:
    """What every dashboard starts with: its two data sources, then the scrape job and training job."""
    return [
        datasource_variable("datasource", "Prometheus", "prometheus"),
        datasource_variable("tempo", "Tempo", "tempo"),
        query_variable("job", "Scrape job", "label_values(fr_info, job)"),
        query_variable("training_job", "Training job", 'label_values(fr_info{job=~"$job"}, training_job)'),
    ]


# ------------------------------------------------------------------------------------------------
# annotations
# ------------------------------------------------------------------------------------------------
def annotation(name: str, expr: str, *, color: str, title: str, tags: str, text: str) -> WithFields:
    """A Prometheus annotation: a marker wherever ``expr`` has a value (checked every 30 s)."""
    query = (db.AnnotationQuery().name(name).datasource(PROMETHEUS).enable(True).icon_color(color)
             .expr(check_ranges(expr)))
    return WithFields(query, {"step": "30s", "titleFormat": title, "tagKeys": tags, "textFormat": text,
                              "useValueForTime": False})


def job_annotations() -> list[cogbuilder.Builder[Any]]:
    """Incidents (the incident counter went up) and firing fr-otel alerts, on every dashboard."""
    return [
        annotation("fr-otel incidents",
                   'max by (job, training_job) (increase(fr_incidents_total{job=~"$job", '
                   'training_job=~"$training_job"}[$__rate_interval])) > 0',
                   color="red", title="fr-otel incident", tags="training_job",
                   text="incident trace(s) exported ({{training_job}}); click an exemplar on Incidents to open one"),
        annotation("fr-otel alerts", 'ALERTS{alertname=~"FrOtel.*", alertstate="firing", job=~"$job"}',
                   color="orange", title="{{alertname}}", tags="severity,pg_name,rank",
                   text="{{alertname}} group={{pg_name}} rank={{rank}}"),
    ]


# ------------------------------------------------------------------------------------------------
# the dashboard
# ------------------------------------------------------------------------------------------------
class Board:
    """One dashboard: identity and variables up front, then rows of panels top to bottom."""

    def __init__(self, uid: str, title: str, description: str, *,
                 variables: Sequence[cogbuilder.Builder[Any]],
                 annotations: Sequence[cogbuilder.Builder[Any]]) -> None:
        self.uid = uid
        self._rows = 0
        self._dashboard = (
            db.Dashboard(title).uid(uid).description(description).tags([TAG]).timezone("browser").editable()
            .tooltip(dm.DashboardCursorSync.CROSSHAIR).live_now(False).refresh("30s").version(1)
            .fiscal_year_start_month(0).time("now-1h", "now")
            .variables(list(variables)).annotations(list(annotations))
            .link(db.DashboardLink("fr-otel dashboards").type(dm.DashboardLinkType.DASHBOARDS).tags([TAG])
                  .as_dropdown(True).include_vars(True).keep_time(True).icon("external link")
                  .target_blank(False).tooltip("").url("")))

    def stat_row(self, title: str, *stats: stat_builder.Panel) -> Board:
        """The row on top: the numbers to read first. Only here may stat panels go."""
        if self._rows:
            raise ValueError(f"{self.uid}: the stat row {title!r} must be the first row")
        return self._row(title, stats)

    def row(self, title: str, *panels: cogbuilder.Builder[dm.Panel]) -> Board:
        """A titled row of panels, flowed left to right and wrapped at 24 columns."""
        for panel in panels:
            if isinstance(panel, stat_builder.Panel):
                raise ValueError(f"{self.uid}: stat panels belong in the stat row on top, not in {title!r}")
        return self._row(title, panels)

    def _row(self, title: str, panels: Sequence[cogbuilder.Builder[dm.Panel]]) -> Board:
        self._rows += 1
        self._dashboard.with_row(db.Row(title))
        for panel in panels:
            self._dashboard.with_panel(panel)
        return self

    def to_json(self) -> dict[str, Any]:
        """The dashboard as Grafana's file provisioning reads it."""
        model = self._dashboard.build()
        model.schema_version = SCHEMA_VERSION
        for number, panel in enumerate(model.panels or [], start=1):
            panel.id_val = number
        # Provisioning assigns the numeric id; the (empty) time picker keeps Grafana's defaults.
        payload = {"id": None, **json.loads(json.dumps(model, cls=JSONEncoder)), "timepicker": {}}
        # Identity first and panels last, as Grafana writes it: a reader of the file sees what it is.
        first, last = ("id", "uid", "title", "description", "tags"), ("templating", "annotations", "links", "panels")
        middle = [key for key in payload if key not in first + last]
        return {key: payload[key] for key in (*first, *middle, *last) if key in payload}


def render(board: Board) -> str:
    """The dashboard's file content: two-space indented JSON, one trailing newline."""
    return json.dumps(board.to_json(), indent=2, ensure_ascii=False) + "\n"
