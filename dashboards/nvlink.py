"""NVLink and collectives: per-link throughput and errors, collective latency and bandwidth."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from stormwatch.dashboards.panels import (
    ANY_IS_BAD,
    JOB,
    JOB_RANK,
    NODE_GPU,
    PanelBuilder,
    Query,
    gpu_variable,
    job_variable,
    new_dashboard,
    node_variable,
    rank_variable,
    timeseries_panel,
    with_sections,
)

TITLE = "Stormwatch / NVLink and collectives"

_RATE = "[$__rate_interval]"
_LINK = "{{node}} GPU {{gpu}} link {{link}}"
_OP = "{{op}} / {{mesh_dim}}"


def _latency_quantile(q: float) -> Query:
    return Query(
        f"histogram_quantile({q}, sum by (op, mesh_dim, le) "
        f"(rate(stormwatch_collective_latency_seconds_bucket{{{JOB_RANK}}}{_RATE})))",
        f"{_OP} p{round(q * 100)}",
    )


def build() -> Dashboard:
    """The NVLink and collectives dashboard (``$job``, ``$rank``, ``$node``, ``$gpu``)."""
    dashboard = (
        new_dashboard(
            TITLE,
            "The fabric: NVLink per link (agent) and the trainer's collectives per op and mesh "
            "dimension (latency quantiles, algbw and busbw as nccl-tests define them).",
            ["nvlink", "collectives"],
        )
        .with_variable(job_variable())
        .with_variable(rank_variable())
        .with_variable(node_variable())
        .with_variable(gpu_variable())
    )
    return with_sections(
        dashboard,
        [
            ("NVLink", _nvlink()),
            ("Collectives", _collectives()),
        ],
    )


def _nvlink() -> list[PanelBuilder]:
    """The panels of the 'NVLink' row."""
    return [
        timeseries_panel(
            "NVLink throughput per link",
            "Bytes per second per link and direction (rate of stormwatch_nvlink_data_bytes_total).",
            "Bps",
            [
                Query(
                    f"rate(stormwatch_nvlink_data_bytes_total{{{NODE_GPU}}}{_RATE})",
                    _LINK + " {{direction}}",
                )
            ],
            min_value=0,
        ),
        timeseries_panel(
            "Active links per GPU",
            "Links up per GPU (sum of stormwatch_nvlink_link_up). A drop means a link "
            "went down and traffic falls back to fewer links or PCIe.",
            "none",
            [
                Query(
                    f"sum by (node, gpu) (stormwatch_nvlink_link_up{{{NODE_GPU}}})",
                    "{{node}} GPU {{gpu}}",
                )
            ],
            min_value=0,
        ),
        timeseries_panel(
            "NVLink errors per link",
            "Errors per second per link and counter (stormwatch_nvlink_errors_total: "
            "crc_flit, crc_data, replay, recovery). Recovery errors are the serious kind.",
            "none",
            [
                Query(
                    f"sum by (node, gpu, link, counter) "
                    f"(rate(stormwatch_nvlink_errors_total{{{NODE_GPU}}}{_RATE}))",
                    _LINK + " {{counter}}",
                )
            ],
            thresholds=ANY_IS_BAD,
            min_value=0,
        ),
        timeseries_panel(
            "NVLink errors per GPU (DCGM)",
            "Per-GPU error totals per interval (DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL).",
            "none",
            [
                Query(
                    f"increase(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{NODE_GPU}}}{_RATE})",
                    "{{node}} GPU {{gpu}} CRC flit",
                ),
                Query(
                    f"increase(DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{{{NODE_GPU}}}{_RATE})",
                    "{{node}} GPU {{gpu}} CRC data",
                ),
                Query(
                    f"increase(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{{{NODE_GPU}}}{_RATE})",
                    "{{node}} GPU {{gpu}} replay",
                ),
                Query(
                    f"increase(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{{{NODE_GPU}}}{_RATE})",
                    "{{node}} GPU {{gpu}} recovery",
                ),
            ],
            thresholds=ANY_IS_BAD,
            bars=True,
            min_value=0,
        ),
    ]


def _collectives() -> list[PanelBuilder]:
    """The panels of the 'Collectives' row."""
    return [
        timeseries_panel(
            "Collective latency quantiles",
            "p50 / p90 / p99 of issue-to-completion latency per op and mesh dimension "
            "(stormwatch_collective_latency_seconds histogram, all selected ranks).",
            "s",
            [_latency_quantile(0.5), _latency_quantile(0.9), _latency_quantile(0.99)],
            min_value=0,
            width=24,
        ),
        timeseries_panel(
            "Algorithm bandwidth",
            "algbw = size / time of the last step's collectives, mean over ranks "
            "(stormwatch_collective_algbw_bytes_per_second).",
            "Bps",
            [
                Query(
                    f"avg by (op, mesh_dim) (stormwatch_collective_algbw_bytes_per_second{{{JOB_RANK}}})",
                    _OP,
                )
            ],
            min_value=0,
        ),
        timeseries_panel(
            "Bus bandwidth",
            "busbw = algbw x the op's factor (all_reduce 2(n-1)/n, ...): comparable with "
            "the link speed. Mean per job (recording rule) and the slowest rank.",
            "Bps",
            [
                Query(
                    f"training_job_op_mesh_dim:stormwatch_collective_busbw_bytes_per_second:avg{{{JOB}}}",
                    "{{training_job}} " + _OP + " mean",
                ),
                Query(
                    f"min by (op, mesh_dim) (stormwatch_collective_busbw_bytes_per_second{{{JOB_RANK}}})",
                    _OP + " slowest rank",
                ),
            ],
            min_value=0,
        ),
        timeseries_panel(
            "Collective calls and bytes",
            "Calls per second per op (stormwatch_collective_calls_total) during training steps.",
            "ops",
            [
                Query(
                    f"sum by (op) (rate(stormwatch_collective_calls_total{{{JOB_RANK}}}{_RATE}))",
                    "{{op}}",
                )
            ],
            min_value=0,
        ),
        timeseries_panel(
            "Collective payload rate",
            "Bytes per second per op and mesh dimension (nccl-tests size S: "
            "stormwatch_collective_size_bytes_total).",
            "Bps",
            [
                Query(
                    f"sum by (op, mesh_dim) (rate(stormwatch_collective_size_bytes_total{{{JOB_RANK}}}{_RATE}))",
                    _OP,
                )
            ],
            min_value=0,
        ),
    ]
