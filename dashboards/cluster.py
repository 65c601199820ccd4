"""Cluster overview: job health, throughput, goodput, restarts and active alerts."""

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

TITLE = "Stormwatch / Cluster overview"


def build() -> Dashboard:
    """The cluster overview dashboard (variables ``$datasource``, ``$job``, ``$node``)."""
    dashboard = (
        new_dashboard(
            TITLE,
            "Is every job training, how fast, and what is firing? Start here, then drill down.",
            ["overview"],
        )
        .with_variable(job_variable())
        .with_variable(node_variable())
    )
    return with_sections(
        dashboard,
        [
            ("Health", _health()),
            ("Throughput and goodput", _throughput_and_goodput()),
            ("Alerts", _alerts()),
        ],
    )


def _health() -> list[PanelBuilder]:
    """The panels of the 'Health' row."""
    return [
        stat_panel(
            "Agents up",
            "Scrape targets of the selected nodes that answered their last scrape "
            "(Prometheus `up`). Fewer than the node count: an agent or node is down.",
            "none",
            [Query(f"sum(up{{{NODE}}})")],
            thresholds=((None, "red"), (1, "green")),
        ),
        stat_panel(
            "GPUs up",
            "GPUs the agents can read (stormwatch_gpu_up). A drop means a GPU fell off the bus.",
            "none",
            [Query(f"sum(stormwatch_gpu_up{{{NODE}}})")],
            thresholds=((None, "red"), (1, "green")),
        ),
        stat_panel(
            "Ranks up",
            "Live training ranks of the selected jobs found by the agents' rank watchers.",
            "none",
            [Query(f"sum(stormwatch_rank_up{{{JOB}}})")],
            thresholds=((None, "red"), (1, "green")),
        ),
        stat_panel(
            "Firing alerts",
            "Alerts firing now (Prometheus ALERTS). See the Incidents dashboard.",
            "none",
            [Query('count(ALERTS{alertstate="firing"}) or vector(0)')],
            thresholds=ANY_IS_BAD,
        ),
        timeseries_panel(
            "Job health: live ranks vs world size",
            "Per job, live ranks (stormwatch_rank_up) against the world size the trainer "
            "reports. A gap is a dead or hung rank; torchrun will restart the group.",
            "none",
            [
                Query(
                    f"sum by (training_job) (stormwatch_rank_up{{{JOB}}})", "{{training_job}} live"
                ),
                Query(
                    f"max by (training_job) (stormwatch_train_world_size{{{JOB}}})",
                    "{{training_job}} world size",
                ),
            ],
            min_value=0,
        ),
        timeseries_panel(
            "Restarts and unexpected exits",
            "Restarts of each job (its attempt, agreed by every rank: "
            "training_job:stormwatch_train_job_restarts:max), each node's own torchrun count "
            "(training_job_node:stormwatch_train_node_restarts:max; a node restarted because a peer "
            "failed does not count it) and rank exits without a done marker in the last 15 "
            "minutes, per job.",
            "none",
            [
                Query(
                    f"training_job:stormwatch_train_job_restarts:max{{{JOB}}}",
                    "{{training_job}} restarts",
                ),
                Query(
                    f"training_job_node:stormwatch_train_node_restarts:max{{{JOB}}}",
                    "{{training_job}} {{node}} node restarts",
                ),
                Query(
                    f"sum by (training_job) (training_job_rank_node:stormwatch_rank_unexpected_exits:increase15m{{{JOB}}})",
                    "{{training_job}} unexpected exits (15m)",
                ),
            ],
            thresholds=ANY_IS_BAD,
            min_value=0,
        ),
    ]


def _throughput_and_goodput() -> list[PanelBuilder]:
    """The panels of the 'Throughput and goodput' row."""
    return [
        timeseries_panel(
            "Steps per second",
            "Optimizer steps per second per job (mean over its ranks of "
            "rate(stormwatch_train_steps_total)). Zero while a job restarts or hangs.",
            "none",
            [
                Query(
                    f"avg by (training_job) (rate(stormwatch_train_steps_total{{{JOB}}}[$__rate_interval]))",
                    "{{training_job}}",
                )
            ],
            min_value=0,
            width=8,
        ),
        timeseries_panel(
            "Tokens per second",
            "Training throughput per job (training_job:stormwatch_train_tokens_per_second:avg: the "
            "ranks' mean of stormwatch_train_tokens_per_second).",
            "none",
            [
                Query(
                    f"training_job:stormwatch_train_tokens_per_second:avg{{{JOB}}}",
                    "{{training_job}}",
                )
            ],
            min_value=0,
            width=8,
        ),
        timeseries_panel(
            "Goodput: compute share of step time",
            "Per job, compute seconds / (compute + collective-wait seconds), from the "
            "trainer's counters. 1 = no time lost waiting on communication or stragglers.",
            "percentunit",
            [
                Query(
                    f"sum by (training_job) (rate(stormwatch_train_compute_seconds_total{{{JOB}}}[$__rate_interval]))"
                    f" / (sum by (training_job) (rate(stormwatch_train_compute_seconds_total{{{JOB}}}[$__rate_interval]))"
                    f" + sum by (training_job) (rate(stormwatch_train_collective_wait_seconds_total{{{JOB}}}[$__rate_interval])))",
                    "{{training_job}}",
                )
            ],
            thresholds=((None, "red"), (0.5, "orange"), (0.8, "green")),
            min_value=0,
            max_value=1,
            width=8,
        ),
        timeseries_panel(
            "Model FLOPs utilization",
            "Mean MFU per job (stormwatch_train_mfu_ratio, 0..1 of the peak FLOP/s the "
            "trainer assumed: stormwatch_train_peak_flops_per_second).",
            "percentunit",
            [
                Query(
                    f"avg by (training_job) (stormwatch_train_mfu_ratio{{{JOB}}})",
                    "{{training_job}}",
                )
            ],
            thresholds=((None, "red"), (0.2, "orange"), (0.35, "green")),
            min_value=0,
        ),
        timeseries_panel(
            "Scrape duration",
            "Seconds Prometheus needed to scrape each agent (scrape_duration_seconds). "
            "Close to the scrape interval: the agent is overloaded.",
            "s",
            [Query(f"scrape_duration_seconds{{{NODE}}}", "{{node}}")],
            thresholds=((None, "green"), (0.5, "orange"), (1, "red")),
            min_value=0,
        ),
    ]


def _alerts() -> list[PanelBuilder]:
    """The panels of the 'Alerts' row."""
    return [
        table_panel(
            "Active alerts",
            "Alerts firing or pending now (Prometheus ALERTS); runbooks in docs/runbooks.md.",
            "none",
            [Query("ALERTS")],
        ),
    ]
