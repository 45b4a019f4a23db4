"""The house style: one helper per kind of panel, each taking what varies and applying the rest.

Every panel made here queries through the ``$datasource`` (Prometheus) or ``$tempo`` variable, on
the panel and on each target, carries a unit, and every range in its PromQL is
``$__rate_interval`` (Grafana widens it to at least four scrapes, so a rate never goes blank on a
slow scrape interval; only a stat may total a counter over the whole ``$__range``). Time series
get a legend per query and the same legend table; refIds are A, B, C... in the order given.
A convention broken here is an error when the dashboards are built, not a lint finding later.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap as heatmap_builder
from grafana_foundation_sdk.builders import prometheus, tempo
from grafana_foundation_sdk.builders import stat as stat_builder
from grafana_foundation_sdk.builders import table as table_builder
from grafana_foundation_sdk.builders import timeseries as timeseries_builder
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm
from grafana_foundation_sdk.models import tempo as tm

from fr_otel.common.promql import BLAME_FLOOR_S
from fr_otel.common.stall import DEFAULT_STALL_S

from .links import DataLink

PROMETHEUS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
TEMPO = dm.DataSourceRef(type_val="tempo", uid="${tempo}")

#: Threshold steps, (colour, from value); the first step starts at None (minus infinity).
Steps = Sequence[tuple[str, float | None]]
GREEN: Steps = (("green", None),)
#: A count where one is already bad / worth a look.
RED_FROM_ONE: Steps = (("green", None), ("red", 1))
ORANGE_FROM_ONE: Steps = (("green", None), ("orange", 1))
#: The age of an in-flight collective: worth a look once its group's laggards count as behind
#: (the blame floor), bad once it is stalled (the stall alerts' threshold).
AGE_STEPS: Steps = (("green", None), ("yellow", BLAME_FLOOR_S), ("red", DEFAULT_STALL_S))

#: What a row holds: any panel builder.
Panel = cogbuilder.Builder[dm.Panel]
#: A field or series override: which fields, and what it sets on them.
Override = tuple[dm.MatcherConfig, list[dm.DynamicConfigValue]]
#: A query of a time series panel: (PromQL, legend).
Series = tuple[str, str]

_STRING = re.compile(r'"(?:\\.|[^"\\])*"')
_RANGE = re.compile(r"\[([^\]]*)\]")


def check_ranges(expr: str, *, whole_range: bool = False) -> str:
    """``expr`` if every range selector in it is ``[$__rate_interval]`` (or, where
    ``whole_range``, ``[$__range]``); a ValueError naming the range otherwise."""
    for found in _RANGE.findall(_STRING.sub('""', expr)):  # a regex in a label string is no range
        if found == "$__rate_interval" or (whole_range and found == "$__range"):
            continue
        allowed = "[$__rate_interval] or [$__range]" if whole_range else "[$__rate_interval]"
        raise ValueError(f"range [{found}] in {expr!r}: use {allowed}")
    return expr


def ref_id(index: int) -> str:
    """The refId of a panel's query number ``index``: A, B, C..."""
    return chr(ord("A") + index)


def value_columns(count: int) -> list[str]:
    """The table columns of the first ``count`` queries' values (``Value #A``...), for :class:`Columns`."""
    return [f"Value #{ref_id(i)}" for i in range(count)]


def _legend(legend: str, expr: str) -> str:
    if not legend.strip() or legend == "__auto":
        raise ValueError(f"a time series query needs a legend naming its series: {expr!r}")
    return legend


def _thresholds(steps: Steps) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(color=color, value=value) for color, value in steps])


def _query(ref: int, expr: str, *, legend: str = "__auto", instant: bool, table: bool = False,
           exemplar: bool = False) -> prometheus.Dataquery:
    query = (prometheus.Dataquery().datasource(PROMETHEUS).ref_id(ref_id(ref)).expr(expr)
             .legend_format(legend).editor_mode(pm.QueryEditorMode.CODE)
             .format(pm.PromQueryFormat.TABLE if table else pm.PromQueryFormat.TIME_SERIES))
    query = query.instant() if instant else query.range()
    return query.exemplar(True) if exemplar else query


def stat(title: str, expr: str, *, unit: str, description: str = "", steps: Steps = GREEN,
         decimals: int | None = None, mappings: Sequence[dm.ValueMapping] = (), w: int = 4,
         h: int = 4) -> stat_builder.Panel:
    """One number, its background coloured by ``steps``. Stats go in the dashboard's top row."""
    panel = (stat_builder.Panel().title(title).description(description).datasource(PROMETHEUS)
             .with_target(_query(0, check_ranges(expr, whole_range=True), instant=True))
             .unit(unit).color_scheme(db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
             .thresholds(_thresholds(steps)).mappings(list(mappings))
             .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
             .color_mode(cm.BigValueColorMode.BACKGROUND).graph_mode(cm.BigValueGraphMode.NONE)
             .justify_mode(cm.BigValueJustifyMode.AUTO).orientation(cm.VizOrientation.AUTO)
             .text_mode(cm.BigValueTextMode.AUTO).wide_layout(True).span(w).height(h))
    return panel if decimals is None else panel.decimals(decimals)


def timeseries(title: str, queries: Sequence[Series], *, unit: str, description: str = "",
               soft_min: float | None = 0, threshold: float | None = None,
               legend_calcs: Sequence[str] = ("max", "lastNotNull"), overrides: Sequence[Override] = (),
               exemplars: bool = False, w: int = 12, h: int = 8) -> timeseries_builder.Panel:
    """Lines, one per series, with a legend table (max and last) on the right.

    ``threshold`` draws a dashed line at an alert's threshold; ``soft_min=None`` lets the axis
    start where the data does (sequence numbers, steps); ``exemplars`` marks each query's
    exemplars (a dot that opens the trace)."""
    panel = (timeseries_builder.Panel().title(title).description(description).datasource(PROMETHEUS)
             .unit(unit).color_scheme(db.FieldColor().mode(dm.FieldColorModeId.PALETTE_CLASSIC))
             .draw_style(cm.GraphDrawStyle.LINE).line_width(1).fill_opacity(10)
             .show_points(cm.VisibilityMode.NEVER).span_nulls(False)
             .thresholds(_thresholds(GREEN if threshold is None else (("green", None), ("orange", threshold))))
             .thresholds_style(cb.GraphThresholdsStyleConfig().mode(
                 cm.GraphThresholdsStyleMode.OFF if threshold is None else cm.GraphThresholdsStyleMode.DASHED))
             .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE)
                     .placement(cm.LegendPlacement.RIGHT).calcs(list(legend_calcs)).show_legend(True))
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
             .span(w).height(h))
    for ref, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(ref, check_ranges(expr), legend=_legend(legend, expr), instant=False,
                                         exemplar=exemplars))
    for matcher, properties in overrides:
        panel = panel.with_override(matcher, properties)
    return panel if soft_min is None else panel.axis_soft_min(soft_min)


def heatmap(title: str, query: Series, *, unit: str, y_label: str, description: str = "", w: int = 24,
            h: int = 9) -> heatmap_builder.Panel:
    """Series x time, colour for the value (dark orange is hot): one row per series, no bucketing."""
    expr, legend = query
    return (heatmap_builder.Panel().title(title).description(description).datasource(PROMETHEUS)
            .with_target(_query(0, check_ranges(expr), legend=_legend(legend, expr), instant=False)).unit(unit)
            .hide_from(cb.HideSeriesConfig().legend(False).tooltip(False).viz(False))
            .scale_distribution(cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LINEAR))
            .calculate(False).cell_gap(1).cell_values(heatmap_builder.CellValues().unit(unit))
            .color(heatmap_builder.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Oranges")
                   .fill("dark-orange").scale(hm.HeatmapColorScale.EXPONENTIAL).exponent(0.5).steps(64)
                   .reverse(False))
            .exemplars_color("rgba(255,0,255,0.7)")
            .filter_values(heatmap_builder.FilterValueRange().le(1e-09)).show_legend()
            .rows_frame(heatmap_builder.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.AUTO))
            .mode(cm.TooltipDisplayMode.SINGLE).hide_y_histogram().show_color_scale(True)
            .y_axis(heatmap_builder.YAxisConfig().axis_placement(cm.AxisPlacement.LEFT).reverse(False)
                    .axis_label(y_label))
            .span(w).height(h))


def _no_footer() -> cb.TableFooterOptions:
    # Grafana writes fields "" (every numeric field) where the SDK types a list.
    return cb.TableFooterOptions().show(False).reducer(["sum"]).fields("")  # type: ignore[arg-type]


@dataclass(frozen=True)
class Columns:
    """How a table shows its merged queries: the order of its columns (query values are
    ``Value #A``, ``Value #B``...), their headers, and what it hides besides ``Time`` and
    ``__name__``."""

    order: Sequence[str]
    rename: dict[str, str] = dataclass_field(default_factory=dict)
    hide: Sequence[str] = ("job",)

    def headers(self) -> list[str]:
        """The columns as the table shows them, in order."""
        return [self.rename.get(name, name) for name in self.order]

    def transformation(self) -> dm.DataTransformerConfig:
        return dm.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {name: True for name in ("Time", "__name__", *self.hide)},
            "renameByName": dict(self.rename),
            "indexByName": {name: i for i, name in enumerate(self.order)},
        })


def table(title: str, exprs: Sequence[str], *, unit: str, columns: Columns, description: str = "",
          sort: str | None = None, fields: Sequence[Override] = (), links: Sequence[DataLink] = (),
          w: int = 24, h: int = 8) -> table_builder.Panel:
    """Instant queries merged into one row per label set, columns as ``columns`` says, sorted
    by the column ``sort`` (descending). ``fields`` overrides single columns (units, links).
    Sorting by, or overriding, a column the table does not show fails the build."""
    named = [sort] if sort else []
    named += [matcher.options for matcher, _ in fields if matcher.id_val == "byName"]
    if unknown := [name for name in named if name not in columns.headers()]:
        raise ValueError(f"table {title!r}: no column {unknown} among {columns.headers()}")
    panel = (table_builder.Panel().title(title).description(description).datasource(PROMETHEUS).unit(unit)
             .align(cm.FieldTextAlignment.AUTO).filterable(True).thresholds(_thresholds(GREEN))
             .show_header(True).cell_height(cm.TableCellHeight.SM)
             .footer(_no_footer())
             .sort_by([cb.TableSortByFieldState().display_name(sort).desc(True)] if sort else [])
             .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
             .with_transformation(columns.transformation())
             .span(w).height(h))
    if sort:
        panel = panel.with_transformation(dm.DataTransformerConfig(
            id_val="sortBy", options={"fields": {}, "sort": [{"field": sort, "desc": True}]}))
    for ref, expr in enumerate(exprs):
        panel = panel.with_target(_query(ref, check_ranges(expr), instant=True, table=True))
    for matcher, properties in fields:
        panel = panel.with_override(matcher, properties)
    return panel.links(list(links)) if links else panel


def _traceql(query: str, *, table_type: bool) -> tempo.TempoQuery:
    q = tempo.TempoQuery().datasource(TEMPO).ref_id("A").query_type("traceql").limit(20).query(query)
    return q.table_type(tm.SearchTableType.TRACES) if table_type else q


def trace_search(title: str, traceql: str, *, description: str = "", w: int = 24, h: int = 8) -> table_builder.Panel:
    """The traces a TraceQL search finds, one row per trace (click one to open it)."""
    return (table_builder.Panel().title(title).description(description).datasource(TEMPO).unit("none")
            .align(cm.FieldTextAlignment.AUTO).show_header(True).cell_height(cm.TableCellHeight.SM)
            .footer(_no_footer())
            .with_target(_traceql(traceql, table_type=True)).span(w).height(h))


def trace_view(title: str, trace_id: str, *, description: str = "", w: int = 24, h: int = 14) -> db.Panel:
    """One trace, by id (the SDK has no builder for Grafana's traces panel: a plain panel of that type)."""
    return (db.Panel().type("traces").title(title).description(description).datasource(TEMPO).unit("none")
            .options({}).with_target(_traceql(trace_id, table_type=False)).span(w).height(h))


# ------------------------------------------------------------------------------------------------
# overrides
# ------------------------------------------------------------------------------------------------
def field(name: str, *, unit: str | None = None, links: Sequence[DataLink] = (),
          mappings: Sequence[dm.ValueMapping] = (), thresholds: Steps | None = None,
          background: bool = False) -> Override:
    """Override one table column: its unit, links, value mappings, thresholds, and a cell
    coloured by them (``background``)."""
    properties = []
    if unit is not None:
        properties.append(dm.DynamicConfigValue(id_val="unit", value=unit))
    if links:
        properties.append(dm.DynamicConfigValue(id_val="links", value=[link.build() for link in links]))
    if mappings:
        properties.append(dm.DynamicConfigValue(id_val="mappings", value=list(mappings)))
    if thresholds is not None:
        properties.append(dm.DynamicConfigValue(id_val="thresholds", value=_thresholds(thresholds).build()))
    if background:
        properties.append(dm.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"}))
    if not properties:
        raise ValueError(f"field override {name!r} sets nothing")
    return dm.MatcherConfig(id_val="byName", options=name), properties


def series(regex: str, *, color: str | None = None, dashed: bool = False) -> Override:
    """Override the series whose name matches ``regex``: a fixed colour, or a dashed unfilled line."""
    properties = []
    if color is not None:
        properties.append(dm.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": color}))
    if dashed:
        properties += [dm.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
                       dm.DynamicConfigValue(id_val="custom.fillOpacity", value=0)]
    if not properties:
        raise ValueError(f"series override {regex!r} sets nothing")
    return dm.MatcherConfig(id_val="byRegexp", options=regex), properties


def yes_between(low: float, high: float, color: str = "red") -> dm.ValueMapping:
    """Show values in [low, high] as YES in ``color`` (a 0/1 flag column)."""
    return dm.RangeMap(options=dm.DashboardRangeMapOptions(
        from_val=low, to=high, result=dm.ValueMappingResult(text="YES", color=color, index=0)))


def on_off() -> dm.ValueMapping:
    """Show 0 as a red OFF and 1 as a green ON."""
    return dm.ValueMap(options={"0": dm.ValueMappingResult(text="OFF", color="red", index=0),
                                "1": dm.ValueMappingResult(text="ON", color="green", index=1)})
