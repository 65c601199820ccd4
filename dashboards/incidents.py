"""Incidents: firing and pending alerts, their counts over time, and chaos faults next to them."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from stormwatch.dashboards.panels import (
    ANY_IS_BAD,
    JOB,
    NODE,
    PanelBuilder,
    Query,
    job_variable,
    new_dashboard,
    node_variable,
    stat_panel,
    table_panel,
    timeseries_panel,
    with_sections,
)

TITLE = "Stormwatch / Incidents"

_RATE = "[$__rate_interval]"


def build() -> Dashboard:
    """The incidents dashboard (variables ``$datasource``, ``$job``, ``$node``)."""
    dashboard = (
        new_dashboard(
            TITLE,
            "What is firing, since when, and which faults were injected meanwhile "
            "(Prometheus ALERTS; the responder groups alerts into incidents by alertname and job).",
            ["alerts", "incidents"],
        )
        .with_variable(job_variable())
        .with_variable(node_variable())
    )
    return with_sections(
        dashboard,
        [
            ("Now", _now()),
            ("History", _history()),
            ("Faults and exits", _faults_and_exits()),
        ],
    )


def _now() -> list[PanelBuilder]:
    """The panels of the 'Now' row."""
    return [
        stat_panel(
            "Firing",
            'Alerts firing now (ALERTS{alertstate="firing"}).',
            "none",
            [Query('count(ALERTS{alertstate="firing"}) or vector(0)')],
            thresholds=ANY_IS_BAD,
            width=8,
        ),
        stat_panel(
            "Critical firing",
            "Firing alerts with severity=critical: page-worthy.",
            "none",
            [Query('count(ALERTS{alertstate="firing", severity="critical"}) or vector(0)')],
            thresholds=ANY_IS_BAD,
            width=8,
        ),
        stat_panel(
            "Pending",
            "Alerts whose condition holds but whose `for` has not elapsed yet.",
            "none",
            [Query('count(ALERTS{alertstate="pending"}) or vector(0)')],
            thresholds=((None, "green"), (1, "orange")),
            width=8,
        ),
        table_panel(
            "Firing alerts",
            "Every firing alert with its labels (training_job, rank, node, gpu, severity).",
            "none",
            [Query('ALERTS{alertstate="firing"}')],
        ),
    ]


def _history() -> list[PanelBuilder]:
    """The panels of the 'History' row."""
    return [
        timeseries_panel(
            "Firing alerts by name",
            "Count of firing alerts per alertname and severity over time.",
            "none",
            [
                Query(
                    'count by (alertname, severity) (ALERTS{alertstate="firing"})',
                    "{{alertname}} ({{severity}})",
                )
            ],
            min_value=0,
            stacked=True,
        ),
        timeseries_panel(
            "Firing alerts by job and node",
            "Firing alerts that carry the selected training job or node label.",
            "none",
            [
                Query(
                    f'count by (training_job) (ALERTS{{alertstate="firing", {JOB}}})',
                    "job {{training_job}}",
                ),
                Query(
                    f'count by (node) (ALERTS{{alertstate="firing", {NODE}}})',
                    "node {{node}}",
                ),
            ],
            min_value=0,
        ),
    ]


def _faults_and_exits() -> list[PanelBuilder]:
    """The panels of the 'Faults and exits' row."""
    return [
        timeseries_panel(
            "Chaos faults",
            "Faults active on the agents (stormwatch_faults_active) and injections per "
            "interval (stormwatch_faults_injected_total), by kind.",
            "none",
            [
                Query(
                    f"sum by (node, kind) (stormwatch_faults_active{{{NODE}}})",
                    "{{node}} {{kind}} active",
                ),
                Query(
                    f"sum by (node, kind) (increase(stormwatch_faults_injected_total{{{NODE}}}{_RATE}))",
                    "{{node}} {{kind}} injected",
                ),
            ],
            min_value=0,
        ),
        timeseries_panel(
            "Unexpected rank exits",
            "Rank exits without a done marker within 5 minutes "
            "(training_job_rank:stormwatch_rank_unexpected_exits:increase5m).",
            "none",
            [
                Query(
                    f"training_job_rank:stormwatch_rank_unexpected_exits:increase5m{{{JOB}}}",
                    "{{training_job}} rank {{rank}}",
                )
            ],
            thresholds=ANY_IS_BAD,
            min_value=0,
        ),
    ]
