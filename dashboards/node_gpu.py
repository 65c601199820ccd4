"""Node and GPU: dcgm-exporter-compatible GPU panels plus the host, per node and GPU."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from stormwatch.dashboards.panels import (
    ANY_IS_BAD,
    NODE,
    NODE_GPU,
    PanelBuilder,
    Query,
    gpu_variable,
    new_dashboard,
    node_variable,
    timeseries_panel,
    with_sections,
)

TITLE = "Stormwatch / Node and GPU"

_L = "{{node}} GPU {{gpu}}"
_RATE = "[$__rate_interval]"


def _per_gpu(metric: str, scale: str = "") -> Query:
    return Query(f"{metric}{{{NODE_GPU}}}{scale}", _L)


def build() -> Dashboard:
    """The node and GPU dashboard (variables ``$datasource``, ``$node``, ``$gpu``)."""
    dashboard = (
        new_dashboard(
            TITLE,
            "Per node and GPU: utilization, memory, temperature, power, clocks, throttling, "
            "XID and ECC history (dcgm-exporter metric names, as the stormwatch agent exports).",
            ["gpu", "dcgm"],
        )
        .with_variable(node_variable())
        .with_variable(gpu_variable())
    )
    return with_sections(
        dashboard,
        [
            ("Health", _health()),
            ("Utilization", _utilization()),
            ("Memory", _memory()),
            ("Temperature, power, clocks", _temperature_power_clocks()),
            ("Throttling", _throttling()),
            ("XID and ECC history", _xid_and_ecc_history()),
        ],
    )


def _health() -> list[PanelBuilder]:
    """The panels of the 'Health' row."""
    return [
        timeseries_panel(
            "GPU readable",
            "1 while the agent can read the GPU through NVML (stormwatch_gpu_up); 0 means "
            "the GPU is lost (fell off the bus, XID 79) and its other panels go blank.",
            "bool_yes_no",
            [_per_gpu("stormwatch_gpu_up")],
            thresholds=((None, "red"), (1, "green")),
            min_value=0,
            max_value=1,
            width=8,
        ),
        timeseries_panel(
            "Health watches",
            "DCGM_EXP_GPU_HEALTH_STATUS per watch (MEM, THERMAL, POWER, XID): 0 pass, "
            "10 warn, 20 fail, derived by the agent from NVML readings.",
            "none",
            [Query(f"DCGM_EXP_GPU_HEALTH_STATUS{{{NODE_GPU}}}", _L + " {{health_watch}}")],
            thresholds=((None, "green"), (10, "orange"), (20, "red")),
            min_value=0,
            width=8,
        ),
        timeseries_panel(
            "Host CPU and memory",
            "Host CPU utilization and memory used / total (stormwatch_host_*).",
            "percentunit",
            [
                Query(f"stormwatch_host_cpu_utilization_ratio{{{NODE}}}", "{{node}} CPU"),
                Query(
                    f"stormwatch_host_memory_used_bytes{{{NODE}}}"
                    f" / stormwatch_host_memory_total_bytes{{{NODE}}}",
                    "{{node}} memory",
                ),
            ],
            thresholds=((None, "green"), (0.9, "red")),
            min_value=0,
            max_value=1,
            width=8,
        ),
    ]


def _utilization() -> list[PanelBuilder]:
    """The panels of the 'Utilization' row."""
    return [
        timeseries_panel(
            "GPU utilization",
            "Percent of time a kernel ran (DCGM_FI_DEV_GPU_UTIL). Coarse: one tiny kernel "
            "counts as busy; see SM active for real occupancy.",
            "percent",
            [_per_gpu("DCGM_FI_DEV_GPU_UTIL")],
            min_value=0,
            max_value=100,
        ),
        timeseries_panel(
            "SM active, tensor pipe, DRAM active",
            "Profiling ratios 0..1 (DCGM_FI_PROF_SM_ACTIVE, _PIPE_TENSOR_ACTIVE, "
            "_DRAM_ACTIVE; NVML GPM, Hopper and later).",
            "percentunit",
            [
                Query(f"DCGM_FI_PROF_SM_ACTIVE{{{NODE_GPU}}}", _L + " SM"),
                Query(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{NODE_GPU}}}", _L + " tensor"),
                Query(f"DCGM_FI_PROF_DRAM_ACTIVE{{{NODE_GPU}}}", _L + " DRAM"),
            ],
            min_value=0,
            max_value=1,
        ),
    ]


def _memory() -> list[PanelBuilder]:
    """The panels of the 'Memory' row."""
    return [
        timeseries_panel(
            "Framebuffer used",
            "Device memory used (DCGM_FI_DEV_FB_USED, MiB).",
            "mbytes",
            [_per_gpu("DCGM_FI_DEV_FB_USED")],
            min_value=0,
        ),
        timeseries_panel(
            "Framebuffer used share",
            "FB used / (used + free + reserved). Near 1 risks out-of-memory errors.",
            "percentunit",
            [
                Query(
                    f"DCGM_FI_DEV_FB_USED{{{NODE_GPU}}} / (DCGM_FI_DEV_FB_USED{{{NODE_GPU}}}"
                    f" + DCGM_FI_DEV_FB_FREE{{{NODE_GPU}}} + DCGM_FI_DEV_FB_RESERVED{{{NODE_GPU}}})",
                    _L,
                )
            ],
            thresholds=((None, "green"), (0.9, "orange"), (0.97, "red")),
            min_value=0,
            max_value=1,
        ),
    ]


def _temperature_power_clocks() -> list[PanelBuilder]:
    """The panels of the 'Temperature, power, clocks' row."""
    return [
        timeseries_panel(
            "Temperature",
            "GPU core and HBM temperature (DCGM_FI_DEV_GPU_TEMP, _MEMORY_TEMP, °C). "
            "Throttling starts in the mid 80s on data-centre GPUs.",
            "celsius",
            [
                Query(f"DCGM_FI_DEV_GPU_TEMP{{{NODE_GPU}}}", _L + " core"),
                Query(f"DCGM_FI_DEV_MEMORY_TEMP{{{NODE_GPU}}}", _L + " memory"),
            ],
            thresholds=((None, "green"), (83, "orange"), (90, "red")),
            width=8,
        ),
        timeseries_panel(
            "Power",
            "Board power draw (DCGM_FI_DEV_POWER_USAGE, W) and the energy counter's rate "
            "(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ, / 1000 = W).",
            "watt",
            [
                Query(f"DCGM_FI_DEV_POWER_USAGE{{{NODE_GPU}}}", _L + " draw"),
                Query(
                    f"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{NODE_GPU}}}{_RATE}) / 1000",
                    _L + " from energy",
                ),
            ],
            min_value=0,
            width=8,
        ),
        timeseries_panel(
            "Clocks",
            "SM and memory clocks (DCGM_FI_DEV_SM_CLOCK, _MEM_CLOCK, MHz, shown in Hz). "
            "An SM clock drop under load is throttling; see the next panels for why.",
            "hertz",
            [
                Query(f"DCGM_FI_DEV_SM_CLOCK{{{NODE_GPU}}} * 1e6", _L + " SM"),
                Query(f"DCGM_FI_DEV_MEM_CLOCK{{{NODE_GPU}}} * 1e6", _L + " memory"),
            ],
            min_value=0,
            width=8,
        ),
    ]


def _throttling() -> list[PanelBuilder]:
    """The panels of the 'Throttling' row."""
    return [
        timeseries_panel(
            "Throttle reasons active",
            "Clock event reasons decoded from DCGM_FI_DEV_CLOCK_THROTTLE_REASONS "
            "(stormwatch_gpu_clocks_event_active, 1 = active). gpu_idle is harmless; "
            "hw_slowdown, *thermal* and power_brake are not.",
            "none",
            [
                Query(
                    f"stormwatch_gpu_clocks_event_active{{{NODE_GPU}}}",
                    _L + " {{reason}}",
                )
            ],
            min_value=0,
            max_value=1,
            stacked=True,
        ),
        timeseries_panel(
            "Time throttled by power and temperature",
            "Share of time the GPU was held back, from the violation timers "
            "(DCGM_FI_DEV_POWER_VIOLATION, _THERMAL_VIOLATION, µs, rate / 1e6).",
            "percentunit",
            [
                Query(
                    f"rate(DCGM_FI_DEV_POWER_VIOLATION{{{NODE_GPU}}}{_RATE}) / 1e6",
                    _L + " power",
                ),
                Query(
                    f"rate(DCGM_FI_DEV_THERMAL_VIOLATION{{{NODE_GPU}}}{_RATE}) / 1e6",
                    _L + " thermal",
                ),
            ],
            thresholds=((None, "green"), (0.05, "orange"), (0.25, "red")),
            min_value=0,
        ),
    ]


def _xid_and_ecc_history() -> list[PanelBuilder]:
    """The panels of the 'XID and ECC history' row."""
    return [
        timeseries_panel(
            "Last XID",
            "Code of the GPU's most recent XID error (DCGM_FI_DEV_XID_ERRORS; 0 = none).",
            "none",
            [_per_gpu("DCGM_FI_DEV_XID_ERRORS")],
            thresholds=ANY_IS_BAD,
            width=8,
        ),
        timeseries_panel(
            "XID errors by code",
            "XID errors per interval by code (stormwatch_gpu_xid_errors_total; the series "
            "exists once a GPU has reported an XID). 48, 79 and 92-95 need a drain.",
            "none",
            [
                Query(
                    f"sum by (node, gpu, code) (increase(stormwatch_gpu_xid_errors_total{{{NODE_GPU}}}{_RATE}))",
                    _L + " XID {{code}}",
                )
            ],
            thresholds=ANY_IS_BAD,
            bars=True,
            width=8,
        ),
        timeseries_panel(
            "ECC errors",
            "Volatile single-bit (corrected) and double-bit (uncorrected) ECC errors per "
            "interval (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, _DBE_VOL_TOTAL). Any DBE: drain.",
            "none",
            [
                Query(
                    f"increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{NODE_GPU}}}{_RATE})",
                    _L + " SBE",
                ),
                Query(
                    f"increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{NODE_GPU}}}{_RATE})",
                    _L + " DBE",
                ),
            ],
            thresholds=ANY_IS_BAD,
            bars=True,
            width=8,
        ),
        timeseries_panel(
            "Retired pages and remapped rows",
            "Aggregate retired pages (DCGM_FI_DEV_RETIRED_SBE/_DBE), uncorrectable "
            "remapped rows and row-remap failure (1 = the GPU needs replacement).",
            "none",
            [
                Query(f"DCGM_FI_DEV_RETIRED_DBE{{{NODE_GPU}}}", _L + " retired DBE"),
                Query(f"DCGM_FI_DEV_RETIRED_SBE{{{NODE_GPU}}}", _L + " retired SBE"),
                Query(
                    f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{NODE_GPU}}}",
                    _L + " uncorrectable remapped rows",
                ),
                Query(f"DCGM_FI_DEV_ROW_REMAP_FAILURE{{{NODE_GPU}}}", _L + " remap failure"),
            ],
            thresholds=ANY_IS_BAD,
        ),
        timeseries_panel(
            "PCIe throughput and replays",
            "PCIe bytes per second each way (DCGM_FI_PROF_PCIE_TX/RX_BYTES) and link-level "
            "replays per second (DCGM_FI_DEV_PCIE_REPLAY_COUNTER, same axis; any replay is bad).",
            "Bps",
            [
                Query(f"DCGM_FI_PROF_PCIE_TX_BYTES{{{NODE_GPU}}}", _L + " TX"),
                Query(f"DCGM_FI_PROF_PCIE_RX_BYTES{{{NODE_GPU}}}", _L + " RX"),
                Query(
                    f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{NODE_GPU}}}{_RATE})",
                    _L + " replays/s",
                ),
            ],
            min_value=0,
        ),
    ]
