"""Shared building blocks: data source, template variables and panel helpers.

Every panel takes its Prometheus data source from the ``$datasource`` variable
and gets a title, a description, a unit and (where a level means something)
thresholds. Queries are plain PromQL strings; their metric names must exist in
``agent/catalogue.csv`` or in ``alerts/rules/*.yml`` (tests/dashboards checks).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import heatmap as heatmap_model
from grafana_foundation_sdk.models import prometheus as prom_model

#: Every panel's data source: the dashboard's ``$datasource`` variable.
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")

#: Selector fragments shared by the dashboards (Grafana expands ``=~"$var"`` to a regex).
#: ``$job`` selects by ``training_job``: ``job`` is Prometheus's scrape job.
JOB = 'training_job=~"$job"'
RANK = 'rank=~"$rank"'
NODE = 'node=~"$node"'
GPU = 'gpu=~"$gpu"'
NODE_GPU = f"{NODE}, {GPU}"
JOB_RANK = f"{JOB}, {RANK}"


@dataclass(frozen=True)
class Query:
    """One PromQL target: ``expr`` and the series name template ``legend`` (``{{label}}``)."""

    expr: str
    legend: str = ""
    instant: bool = False
    heatmap: bool = False


Step = tuple[float | None, str]
"""A threshold step: (lower bound or None for the base, Grafana colour name)."""


def _targets(queries: Sequence[Query]) -> list[prometheus.Dataquery]:
    built = []
    for index, query in enumerate(queries):
        target = (
            prometheus.Dataquery()
            .expr(query.expr)
            .ref_id(chr(ord("A") + index))
            .datasource(DATASOURCE)
        )
        if query.legend:
            target = target.legend_format(query.legend)
        if query.instant:
            target = target.instant().format(prom_model.PromQueryFormat.TABLE)
        if query.heatmap:
            target = target.format(prom_model.PromQueryFormat.HEATMAP)
        built.append(target)
    return built


def _thresholds(steps: Sequence[Step]) -> dash.ThresholdsConfig:
    return (
        dash.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


#: Thresholds for values where more is worse but zero is normal (errors, violations).
ANY_IS_BAD: tuple[Step, ...] = ((None, "green"), (1, "red"))


def timeseries_panel(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    *,
    thresholds: Sequence[Step] = (),
    min_value: float | None = None,
    max_value: float | None = None,
    width: int = 12,
    stacked: bool = False,
    bars: bool = False,
) -> timeseries.Panel:
    """A time series panel; ``unit`` is a Grafana unit id (``percent``, ``watt``, ``Bps``, ...)."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .fill_opacity(10)
    )
    for target in _targets(queries):
        panel = panel.with_target(target)
    if thresholds:
        panel = panel.thresholds(_thresholds(thresholds)).thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE)
        )
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS)
    return panel


def stat_panel(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    *,
    thresholds: Sequence[Step] = ((None, "green"),),
    width: int = 6,
) -> stat.Panel:
    """A single-value panel (last value, background coloured by ``thresholds``)."""
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(width)
        .height(4)
        .thresholds(_thresholds(thresholds))
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.AREA)
    )
    for target in _targets(queries):
        panel = panel.with_target(target)
    return panel


def table_panel(
    title: str, description: str, unit: str, queries: Sequence[Query], *, width: int = 24
) -> table.Panel:
    """A table of instant results (one row per series, labels as columns)."""
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
    )
    for target in _targets([Query(q.expr, q.legend, instant=True) for q in queries]):
        panel = panel.with_target(target)
    return panel


def heatmap_panel(
    title: str,
    description: str,
    unit: str,
    query: Query,
    *,
    calculate: bool = False,
    width: int = 12,
) -> heatmap.Panel:
    """A heatmap; without ``calculate`` every series is one row (its legend is the row name)."""
    return (
        heatmap.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
        .calculate(calculate)
        .color(
            heatmap.HeatmapColorOptions()
            .mode(heatmap_model.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .scale(heatmap_model.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
        )
        .y_axis(heatmap.YAxisConfig().unit(unit if query.heatmap else "none"))
        .with_target(_targets([query])[0])
    )


def row(title: str) -> dash.Row:
    """A row header grouping the panels that follow it."""
    return dash.Row(title)


def datasource_variable() -> dash.DatasourceVariable:
    """``$datasource``: any Prometheus data source (default: the provisioned one)."""
    return dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus")


def query_variable(name: str, label: str, query: str, description: str) -> dash.QueryVariable:
    """A multi-value label variable with *All* (``.*``), refreshed with the time range."""
    return (
        dash.QueryVariable(name)
        .label(label)
        .description(description)
        .query(query)
        .datasource(DATASOURCE)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(model.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC)
    )


def job_variable() -> dash.QueryVariable:
    """``$job``: training jobs (the series' ``training_job`` label; the variable keeps its
    name, and with it dashboard links' ``var-job=``)."""
    return query_variable(
        "job",
        "Job",
        "label_values(stormwatch_train_step, training_job)",
        "Training job (STORMWATCH_JOB; the training_job label).",
    )


def rank_variable() -> dash.QueryVariable:
    """``$rank``: global ranks of the selected jobs."""
    return query_variable(
        "rank",
        "Rank",
        'label_values(stormwatch_train_step{training_job=~"$job"}, rank)',
        "Global rank (torchrun RANK).",
    )


def node_variable() -> dash.QueryVariable:
    """``$node``: nodes, from the agents' scrape-target label ``node``."""
    return query_variable(
        "node",
        "Node",
        "label_values(stormwatch_agent_info, node)",
        "Node name (the agent's --node, also its scrape-target label).",
    )


def gpu_variable() -> dash.QueryVariable:
    """``$gpu``: GPU indices on the selected nodes."""
    return query_variable(
        "gpu",
        "GPU",
        'label_values(DCGM_FI_DEV_GPU_UTIL{node=~"$node"}, gpu)',
        "GPU index on the node (dcgm-exporter `gpu` label).",
    )


def uid_for(title: str) -> str:
    """The stable dashboard uid of ``title``: its lower-case slug, at most 40 characters.

    ``"Stormwatch / Node and GPU"`` -> ``"stormwatch-node-and-gpu"``; the same title
    always gives the same uid, so a push updates the dashboard in place.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return slug[:40].rstrip("-")


#: What a panel helper returns and :meth:`Dashboard.with_panel` takes.
PanelBuilder = cogbuilder.Builder[model.Panel]


def with_sections(
    dashboard: dash.Dashboard, sections: Sequence[tuple[str, Sequence[PanelBuilder]]]
) -> dash.Dashboard:
    """``dashboard`` with one row per ``(title, panels)`` section, in order.

    Each dashboard module lists its rows in ``build()`` and keeps each row's panels in a
    function of its own, so a dashboard reads as its table of contents.
    """
    for title, panels in sections:
        dashboard = dashboard.with_row(row(title))
        for panel in panels:
            dashboard = dashboard.with_panel(panel)
    return dashboard


def new_dashboard(title: str, description: str, tags: Sequence[str]) -> dash.Dashboard:
    """A dashboard with stormwatch's defaults: last hour, 30 s refresh, UTC, shared crosshair.

    Its uid is :func:`uid_for` of ``title``.
    """
    return (
        dash.Dashboard(title)
        .uid(uid_for(title))
        .description(description)
        .tags(["stormwatch", *tags])
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("utc")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .editable()
        .annotation(events_annotation())
        .with_variable(datasource_variable())
    )


def events_annotation() -> dash.AnnotationQuery:
    """Grafana's built-in annotation query for stormwatch's events.

    The chaos runner and the responder post annotations tagged ``stormwatch``
    (:mod:`stormwatch.dashboards.annotations`): experiments, faults injected and
    reverted, incidents and actions. Every dashboard shows them on its time axis.
    """
    return (
        dash.AnnotationQuery()
        .name("stormwatch events")
        .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        .enable(True)
        .icon_color("red")
        .target(
            dash.AnnotationTarget().type("tags").tags(["stormwatch"]).match_any(False).limit(100)
        )
    )
