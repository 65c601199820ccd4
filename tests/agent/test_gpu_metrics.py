"""GPU metrics through /metrics with a fake NVML: error injection at every call site, FC-02..05."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from stormwatch.agent import FakeNvml
from stormwatch.agent.gpu.fake import LEGACY_NVLINK_FUNCTIONS
from stormwatch.agent.gpu.nvml_errors import (
    CALL_UNSUPPORTED,
    DEVICE_FATAL,
    UNSUPPORTED,
    error_name,
)

DCGM_DEVICE = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
}
DCGM_LABELS = {
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
}

#: Per-device call sites whose failure costs exactly these metrics.
VALUE_SITES: dict[str, set[str]] = {
    "nvmlDeviceGetUtilizationRates": {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"},
    "nvmlDeviceGetMemoryInfo": {
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_RESERVED",
    },
    "nvmlDeviceGetTemperature": {"DCGM_FI_DEV_GPU_TEMP"},
    "nvmlDeviceGetPowerUsage": {"DCGM_FI_DEV_POWER_USAGE"},
    "nvmlDeviceGetTotalEnergyConsumption": {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"},
    "nvmlDeviceGetClockInfo": {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK"},
    "nvmlDeviceGetEncoderUtilization": {"DCGM_FI_DEV_ENC_UTIL"},
    "nvmlDeviceGetDecoderUtilization": {"DCGM_FI_DEV_DEC_UTIL"},
    "nvmlDeviceGetCurrentClocksEventReasons": {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"},
    "nvmlDeviceGetGridLicensableFeatures_v4": {"DCGM_FI_DEV_VGPU_LICENSE_STATUS"},
    "nvmlGpmMetricsGet": {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES"},
}
#: Field-value metrics among DCGM_DEVICE (lost with a failing nvmlDeviceGetFieldValues).
FIELD_SITE_METRICS = {"DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}
#: Per-device call sites whose (non-fatal) failure costs labels or side metrics only.
OTHER_DEVICE_SITES = (
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetName",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceRegisterEvents",
)
NVLINK_SITES = {"nvmlDeviceGetFieldValues", "nvmlDeviceGetNvLinkState"}
ERROR_CODES = sorted(pynvml.NVMLError._valClassMapping)


@pytest.fixture(scope="module")
def gpu_agent(tmp_path_factory: pytest.TempPathFactory, tools: Any) -> Iterator[Any]:
    """One agent with two fake GPUs for the whole table (a fresh one per case costs minutes)."""
    # Four links per GPU keep the exposition (parsed 500 times) small.
    handle = tools.make_agent(tmp_path_factory.mktemp("gpu-agent"), FakeNvml(2, links_per_gpu=4))
    yield handle
    handle.stop()


def _reset(agent: Any) -> None:
    """Healthy GPUs and freshly acquired handles (so identity call sites run again)."""
    fake: FakeNvml = agent.fake
    fake.clear_errors()
    fake.gpus[1].unsupported_fields.discard(pynvml.NVML_FI_DEV_NVLINK_GET_STATE)
    fake.lose_gpu(1)
    agent.sample()  # drops GPU 1's cached handle
    fake.lose_gpu(1, lost=False)


def _device_metrics(scrape: Any, gpu: str) -> set[str]:
    return {name for name in DCGM_DEVICE if scrape.series(name, gpu=gpu)}


@pytest.mark.parametrize("code", ERROR_CODES, ids=error_name)
@pytest.mark.parametrize("call", [*VALUE_SITES, *OTHER_DEVICE_SITES])
def test_nvml_error_on_one_gpu_keeps_metrics_200_and_other_gpu_exported(
    gpu_agent: Any, tools: Any, call: str, code: int
) -> None:
    _reset(gpu_agent)
    gpm = call.startswith("nvmlGpm")
    # Drivers before R535 lack the "clocks event" name: the agent uses the "throttle" one.
    fallback = call == "nvmlDeviceGetCurrentClocksEventReasons" and (
        code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    )
    if gpm:
        gpu_agent.sample()  # GPM metrics need a previous GPM sample of the re-acquired GPU
    if call == "nvmlDeviceGetNvLinkState":  # asked only where the batched state field is not
        gpu_agent.fake.gpus[1].unsupported_fields.add(pynvml.NVML_FI_DEV_NVLINK_GET_STATE)
    gpu_agent.fake.inject_error(call, code, gpu=1)
    gpu_agent.sample()
    scrape = tools.scrape(gpu_agent.url)  # asserts HTTP 200

    assert scrape.value("stormwatch_collector_up", collector="gpu") == 1
    assert scrape.value("stormwatch_gpu_up", gpu="0") == 1
    assert _device_metrics(scrape, "0") == DCGM_DEVICE, "healthy GPU 0 lost metrics"
    assert scrape.value("stormwatch_host_memory_total_bytes") is not None

    gpu1 = _device_metrics(scrape, "1")
    if code in DEVICE_FATAL or call == "nvmlDeviceGetHandleByIndex":
        assert scrape.value("stormwatch_gpu_up", gpu="1") == 0
        assert gpu1 == set(), "a GPU that is down must not export stale values"
    else:
        assert scrape.value("stormwatch_gpu_up", gpu="1") == 1
        lost = set(VALUE_SITES.get(call, set()))
        if call == "nvmlGpmMetricsGet" and code in CALL_UNSUPPORTED:
            lost.discard("DCGM_FI_PROF_PCIE_TX_BYTES")  # falls back to nvmlDeviceGetPcieThroughput
        if fallback:
            lost = set()
        if call == "nvmlDeviceGetFieldValues":
            lost |= FIELD_SITE_METRICS
        if call == "nvmlDeviceRegisterEvents" and code in CALL_UNSUPPORTED:
            lost.add("DCGM_FI_DEV_XID_ERRORS")  # XIDs cannot be seen: no fake 0
        expected = DCGM_DEVICE - lost
        if not gpm:  # the first sample of a re-acquired GPU has no GPM interval yet
            expected = expected - VALUE_SITES["nvmlGpmMetricsGet"]
        if call in NVLINK_SITES:  # no throughput read -> no bandwidth total (never a fake 0)
            expected = expected - {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"}
        assert gpu1 == expected
    # A capability answer (NOT_SUPPORTED...) is not an error: the metrics it would have
    # produced are marked unsupported instead.
    capability = code in CALL_UNSUPPORTED and call in (*VALUE_SITES, "nvmlDeviceRegisterEvents")
    if capability and not fallback:
        for name in VALUE_SITES.get(call, {"DCGM_FI_DEV_XID_ERRORS"}) - {
            "DCGM_FI_PROF_PCIE_TX_BYTES"
        }:
            assert scrape.value("stormwatch_metric_supported", gpu="1", metric=name) == 0, name
            assert scrape.value("stormwatch_metric_supported", gpu="0", metric=name) is None
    quiet = capability or (call in NVLINK_SITES and code in UNSUPPORTED)
    if not quiet:
        assert (
            scrape.value(
                "stormwatch_gpu_nvml_errors_total", gpu="1", call=call, error=error_name(code)
            )
            or 0
        ) >= 1


@pytest.mark.parametrize("code", ERROR_CODES, ids=error_name)
def test_node_wide_device_count_failure_marks_gpu_collector_down_only(
    gpu_agent: Any, tools: Any, code: int
) -> None:
    _reset(gpu_agent)
    gpu_agent.fake.inject_error("nvmlDeviceGetCount", code)
    gpu_agent.sample()
    scrape = tools.scrape(gpu_agent.url)
    assert scrape.value("stormwatch_collector_up", collector="gpu") == 0
    assert scrape.value("stormwatch_gpu_up", gpu="0") is None
    assert scrape.value("stormwatch_host_cpu_utilization_ratio") is not None
    assert scrape.value("stormwatch_collector_up", collector="host") == 1
    gpu_agent.fake.clear_errors()
    gpu_agent.sample()
    assert tools.scrape(gpu_agent.url).value("stormwatch_collector_up", collector="gpu") == 1


@pytest.mark.parametrize(
    "code", [c for c in ERROR_CODES if c != pynvml.NVML_ERROR_TIMEOUT], ids=error_name
)
@pytest.mark.parametrize("call", ["nvmlEventSetWait", "nvmlEventSetCreate"])
def test_event_api_errors_are_counted_and_gpus_stay_up(
    gpu_agent: Any, tools: Any, call: str, code: int
) -> None:
    _reset(gpu_agent)
    gpu_agent.fake.inject_error(call, code)
    gpu_agent.sample()
    scrape = tools.scrape(gpu_agent.url)
    assert scrape.value("stormwatch_gpu_up", gpu="0") == 1
    assert scrape.value("stormwatch_gpu_up", gpu="1") == 1
    if call == "nvmlEventSetWait":
        assert scrape.value(
            "stormwatch_gpu_nvml_errors_total", gpu="", call=call, error=error_name(code)
        )


def test_dcgm_names_and_labels_match_dcgm_exporter(gpu_agent: Any, tools: Any) -> None:
    _reset(gpu_agent)
    gpu_agent.sample()
    scrape = tools.scrape(gpu_agent.url)
    for name in DCGM_DEVICE:
        for labels, _ in scrape.series(name):
            assert set(labels) == DCGM_LABELS, name
    (labels, temp), _ = scrape.series("DCGM_FI_DEV_GPU_TEMP")
    assert labels["device"] == "nvidia0" and labels["Hostname"] == "node-test"
    assert labels["UUID"].startswith("GPU-") and labels["pci_bus_id"].endswith(":00.0")
    assert 0 < temp < 120
    power = scrape.value("DCGM_FI_DEV_POWER_USAGE", gpu="0")
    assert power is not None and 50 < power < 1000, "watts, not milliwatts"


def test_snapshot_age_grows_without_sampling(gpu_agent: Any, tools: Any) -> None:
    _reset(gpu_agent)
    gpu_agent.sample()
    first = tools.scrape(gpu_agent.url).value("stormwatch_gpu_snapshot_age_seconds")
    tools.wait_for(
        lambda: (
            tools.scrape(gpu_agent.url).value("stormwatch_gpu_snapshot_age_seconds") > first + 0.2
        )
    )


# --------------------------------------------------------------- field cases
def test_fc02_lost_gpu_keeps_other_gpus_exported(start_agent: Any, tools: Any) -> None:
    fake = FakeNvml(4)
    agent = start_agent(fake)
    assert tools.scrape(agent.url).value("stormwatch_gpu_up", gpu="3") == 1
    fake.lose_gpu(3)  # off the bus: the cached handle now fails too
    agent.sample()
    scrape = tools.scrape(agent.url)
    assert scrape.value("stormwatch_gpu_up", gpu="3") == 0
    assert scrape.series("DCGM_FI_DEV_GPU_TEMP", gpu="3") == []
    for gpu in "012":
        assert scrape.value("stormwatch_gpu_up", gpu=gpu) == 1
        assert scrape.value("DCGM_FI_DEV_GPU_TEMP", gpu=gpu) is not None
    assert scrape.series("stormwatch_gpu_nvml_errors_total", gpu="3", error="GPU_IS_LOST")
    # The handle is re-acquired when the GPU comes back.
    fake.lose_gpu(3, lost=False)
    agent.sample()
    assert tools.scrape(agent.url).value("stormwatch_gpu_up", gpu="3") == 1


def test_fc03_xid_counter_keeps_counting_and_last_xid_decays(start_agent: Any, tools: Any) -> None:
    fake = FakeNvml(2)
    agent = start_agent(fake, xid_window_seconds=0.5)
    fake.emit_xid(1, 31)
    agent.sample()
    scrape = tools.scrape(agent.url)
    assert scrape.value("stormwatch_gpu_xid_errors_total", gpu="1", code="31") == 1
    assert scrape.value("DCGM_FI_DEV_XID_ERRORS", gpu="1") == 31
    assert scrape.value("DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0
    # The GPU recovers and stays quiet: the counter holds, the last-XID gauge returns to 0.
    tools.wait_for(lambda: tools.scrape(agent.url).value("DCGM_FI_DEV_XID_ERRORS", gpu="1") == 0)
    agent.sample()
    assert tools.scrape(agent.url).value("stormwatch_gpu_xid_errors_total", gpu="1", code="31") == 1
    fake.emit_xid(1, 31)
    fake.emit_xid(1, 79)
    agent.sample()
    scrape = tools.scrape(agent.url)
    assert scrape.value("stormwatch_gpu_xid_errors_total", gpu="1", code="31") == 2
    assert scrape.value("stormwatch_gpu_xid_errors_total", gpu="1", code="79") == 1


def test_fc04_unsupported_nvlink_throughput_is_not_exported_as_zero(
    start_agent: Any, tools: Any
) -> None:
    fake = FakeNvml(2, links_per_gpu=12)  # A100: 12 links, throughput fields NOT_SUPPORTED
    for link in fake.gpus[0].links:
        link.throughput_supported = False
    agent = start_agent(fake)
    scrape = tools.scrape(agent.url)
    for link in range(12):
        assert scrape.value("stormwatch_nvlink_supported", gpu="0", link=str(link)) == 0
        assert scrape.value("stormwatch_nvlink_link_up", gpu="0", link=str(link)) == 1
    assert scrape.series("stormwatch_nvlink_data_bytes_total", gpu="0") == []
    assert scrape.series("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="0") == []
    # The supported GPU next to it still reports real traffic.
    assert scrape.value("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="1") > 0
    assert len(scrape.series("stormwatch_nvlink_data_bytes_total", gpu="1")) == 24


def test_fc04_gpu_without_nvlink_is_marked_unsupported_once(start_agent: Any, tools: Any) -> None:
    agent = start_agent(FakeNvml(1, links_per_gpu=0))  # PCIe card
    scrape = tools.scrape(agent.url)
    assert scrape.series("stormwatch_nvlink_supported", gpu="0") == [
        ({"gpu": "0", "link": "all"}, 0.0)
    ]
    assert scrape.series("stormwatch_nvlink_link_up") == []
    assert scrape.series("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == []


def test_fc05_nvlink_uses_field_values_after_link_state(start_agent: Any, tools: Any) -> None:
    fake = FakeNvml(1, links_per_gpu=18)
    links = fake.gpus[0].links
    for link in links[4:]:
        link.active = False  # links 0-3 active, 4-17 inactive
    links[2].throughput_supported = False  # mixed per-link support
    agent = start_agent(fake)
    scrape = tools.scrape(agent.url)
    assert scrape.value("stormwatch_collector_up", collector="nvlink") == 1
    for link in range(18):
        assert scrape.value("stormwatch_nvlink_link_up", gpu="0", link=str(link)) == (
            1 if link < 4 else 0
        )
    for link in (0, 1, 3):
        assert scrape.value("stormwatch_nvlink_supported", gpu="0", link=str(link)) == 1
        for direction in ("tx", "rx"):
            assert (
                scrape.value(
                    "stormwatch_nvlink_data_bytes_total",
                    gpu="0",
                    link=str(link),
                    direction=direction,
                )
                is not None
            )
    assert scrape.value("stormwatch_nvlink_supported", gpu="0", link="2") == 0
    assert scrape.series("stormwatch_nvlink_data_bytes_total", link="2") == []
    for link in range(4, 18):  # inactive links: state only, no throughput, no support verdict
        assert scrape.series("stormwatch_nvlink_data_bytes_total", link=str(link)) == []
        assert scrape.series("stormwatch_nvlink_supported", link=str(link)) == []
    assert not LEGACY_NVLINK_FUNCTIONS & {name for name, n in fake.calls.items() if n}
    assert scrape.series("stormwatch_gpu_nvml_errors_total", gpu="0") == []


def test_disabled_collectors_do_not_touch_nvml(start_agent: Any, tools: Any) -> None:
    fake = FakeNvml(1)
    agent = start_agent(fake, disabled_collectors=frozenset({"nvlink", "gpu_processes", "xid"}))
    scrape = tools.scrape(agent.url)
    assert scrape.value("DCGM_FI_DEV_GPU_TEMP", gpu="0") is not None
    assert scrape.series("stormwatch_nvlink_link_up") == []
    assert scrape.series("stormwatch_collector_up", collector="nvlink") == []
    for call in (
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlEventSetCreate",
    ):
        assert fake.calls[call] == 0, call
