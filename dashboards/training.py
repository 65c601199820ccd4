"""Training: loss, step time per rank, throughput, MFU, gradient norm, stragglers, checkpoints."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from stormwatch.dashboards.panels import (
    ANY_IS_BAD,
    JOB,
    JOB_RANK,
    PanelBuilder,
    Query,
    heatmap_panel,
    job_variable,
    new_dashboard,
    rank_variable,
    timeseries_panel,
    with_sections,
)

TITLE = "Stormwatch / Training"

_RATE = "[$__rate_interval]"
_R = "{{training_job}} rank {{rank}}"


def build() -> Dashboard:
    """The training dashboard (variables ``$datasource``, ``$job``, ``$rank``)."""
    dashboard = (
        new_dashboard(
            TITLE,
            "The trainer's own view per job and rank: progress, speed, efficiency, stragglers "
            "and checkpoints (stormwatch_train_* metrics).",
            ["training"],
        )
        .with_variable(job_variable())
        .with_variable(rank_variable())
    )
    return with_sections(
        dashboard,
        [
            ("Progress", _progress()),
            ("Speed", _speed()),
            ("Stragglers: compute vs collective wait", _stragglers_compute_vs_collective_wait()),
            ("Checkpoints and health", _checkpoints_and_health()),
        ],
    )


def _progress() -> list[PanelBuilder]:
    """The panels of the 'Progress' row."""
    return [
        timeseries_panel(
            "Loss",
            "Global mean training loss (identical on every rank; training_job:stormwatch_train_loss:avg).",
            "none",
            [Query(f"training_job:stormwatch_train_loss:avg{{{JOB}}}", "{{training_job}}")],
            width=8,
        ),
        timeseries_panel(
            "Gradient norm",
            "Global L2 gradient norm before the optimizer step (stormwatch_train_grad_norm). "
            "Spikes precede loss spikes and divergence.",
            "none",
            [
                Query(
                    f"max by (training_job) (stormwatch_train_grad_norm{{{JOB_RANK}}})",
                    "{{training_job}}",
                )
            ],
            width=8,
        ),
        timeseries_panel(
            "Step",
            "Last completed step per rank (stormwatch_train_step). A flat line while others "
            "climb: that rank is stuck.",
            "none",
            [Query(f"stormwatch_train_step{{{JOB_RANK}}}", _R)],
            width=8,
        ),
    ]


def _speed() -> list[PanelBuilder]:
    """The panels of the 'Speed' row."""
    return [
        heatmap_panel(
            "Step time per rank",
            "Mean step time per rank and interval (stormwatch_train_step_duration_seconds "
            "sum / count); one row per rank, darker = slower. A dark row is a straggler.",
            "s",
            Query(
                f"sum by (rank) (rate(stormwatch_train_step_duration_seconds_sum{{{JOB_RANK}}}{_RATE}))"
                f" / sum by (rank) (rate(stormwatch_train_step_duration_seconds_count{{{JOB_RANK}}}{_RATE}))",
                "{{rank}}",
            ),
        ),
        heatmap_panel(
            "Step time distribution",
            "Histogram of step durations over the selected ranks "
            "(stormwatch_train_step_duration_seconds buckets).",
            "s",
            Query(
                f"sum by (le) (increase(stormwatch_train_step_duration_seconds_bucket{{{JOB_RANK}}}{_RATE}))",
                "{{le}}",
                heatmap=True,
            ),
        ),
        timeseries_panel(
            "Tokens per second",
            "Per rank (stormwatch_train_tokens_per_second) and the job's mean "
            "(training_job:stormwatch_train_tokens_per_second:avg).",
            "none",
            [
                Query(f"stormwatch_train_tokens_per_second{{{JOB_RANK}}}", _R),
                Query(
                    f"training_job:stormwatch_train_tokens_per_second:avg{{{JOB}}}",
                    "{{training_job}} mean",
                ),
            ],
            min_value=0,
        ),
        timeseries_panel(
            "Model FLOPs utilization",
            "MFU per rank (stormwatch_train_mfu_ratio, 0..1 of "
            "stormwatch_train_peak_flops_per_second).",
            "percentunit",
            [Query(f"stormwatch_train_mfu_ratio{{{JOB_RANK}}}", _R)],
            thresholds=((None, "red"), (0.2, "orange"), (0.35, "green")),
            min_value=0,
        ),
    ]


def _stragglers_compute_vs_collective_wait() -> list[PanelBuilder]:
    """The panels of the 'Stragglers: compute vs collective wait' row."""
    return [
        timeseries_panel(
            "Compute per step, per rank",
            "Last step's compute seconds (stormwatch_train_step_compute_seconds). "
            "A compute straggler has the highest compute and the lowest wait.",
            "s",
            [Query(f"stormwatch_train_step_compute_seconds{{{JOB_RANK}}}", _R)],
            min_value=0,
        ),
        timeseries_panel(
            "Collective wait per step, per rank",
            "Last step's seconds with a collective in flight "
            "(stormwatch_train_step_collective_wait_seconds): the ranks waiting for a "
            "straggler show the highest wait.",
            "s",
            [Query(f"stormwatch_train_step_collective_wait_seconds{{{JOB_RANK}}}", _R)],
            min_value=0,
        ),
        timeseries_panel(
            "Wait share of step time, per rank",
            "collective wait / (compute + wait) from the counters over the interval. "
            "High everywhere: communication bound; low on one rank only: that rank straggles.",
            "percentunit",
            [
                Query(
                    f"rate(stormwatch_train_collective_wait_seconds_total{{{JOB_RANK}}}{_RATE})"
                    f" / (rate(stormwatch_train_collective_wait_seconds_total{{{JOB_RANK}}}{_RATE})"
                    f" + rate(stormwatch_train_compute_seconds_total{{{JOB_RANK}}}{_RATE}))",
                    _R,
                )
            ],
            thresholds=((None, "green"), (0.3, "orange"), (0.6, "red")),
            min_value=0,
            max_value=1,
        ),
        timeseries_panel(
            "Compute rate vs job median",
            "Per rank, compute seconds per second (training_job_rank_node:stormwatch_train_compute_"
            "seconds:rate2m) divided by the job's median: above 1 is slower than its peers.",
            "none",
            [
                Query(
                    f"training_job_rank_node:stormwatch_train_compute_seconds:rate2m{{{JOB_RANK}}}"
                    f" / on (training_job) group_left quantile by (training_job) (0.5, "
                    f"training_job_rank_node:stormwatch_train_compute_seconds:rate2m{{{JOB}}})",
                    _R + " ({{node}})",
                )
            ],
            thresholds=((None, "green"), (1.2, "orange"), (1.5, "red")),
            min_value=0,
        ),
    ]


def _checkpoints_and_health() -> list[PanelBuilder]:
    """The panels of the 'Checkpoints and health' row."""
    return [
        timeseries_panel(
            "Checkpoint age",
            "Seconds since the job's last committed checkpoint "
            "(time() - stormwatch_train_last_checkpoint_timestamp_seconds): work at risk.",
            "s",
            [
                Query(
                    f"time() - max by (training_job) (stormwatch_train_last_checkpoint_timestamp_seconds{{{JOB}}})",
                    "{{training_job}}",
                )
            ],
            thresholds=((None, "green"), (1800, "orange"), (3600, "red")),
            min_value=0,
            width=8,
        ),
        timeseries_panel(
            "Heartbeat age per rank",
            "Seconds since each rank last made progress, as the agent sees it "
            "(time() - stormwatch_rank_last_progress_timestamp_seconds).",
            "s",
            [
                Query(
                    f"time() - stormwatch_rank_last_progress_timestamp_seconds{{{JOB_RANK}}}",
                    _R,
                )
            ],
            thresholds=((None, "green"), (30, "orange"), (120, "red")),
            min_value=0,
            width=8,
        ),
        timeseries_panel(
            "Memory per rank",
            "Peak memory per rank (stormwatch_train_memory_bytes: rss on CPU, "
            "cuda_max_allocated on GPU).",
            "bytes",
            [Query(f"stormwatch_train_memory_bytes{{{JOB_RANK}}}", _R + " {{kind}}")],
            min_value=0,
            width=8,
        ),
        timeseries_panel(
            "Telemetry write errors",
            "Failed telemetry writes per second by sink "
            "(stormwatch_train_telemetry_errors_total). Training continues; data is lost.",
            "none",
            [
                Query(
                    f"sum by (training_job, sink) (rate(stormwatch_train_telemetry_errors_total{{{JOB_RANK}}}{_RATE}))",
                    "{{training_job}} {{sink}}",
                )
            ],
            thresholds=ANY_IS_BAD,
            min_value=0,
            width=24,
        ),
    ]
