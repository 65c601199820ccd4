"""Every dcgm-exporter default counter is catalogued and exported, or marked unsupported with a reason."""

from __future__ import annotations

from typing import Any

import pynvml

from stormwatch.agent import FakeNvml, load_catalogue
from stormwatch.agent.gpu.model import DCGM_LABELS

#: Per-GPU DCGM families exported only for a GPU with NVLink.
NVLINK_ONLY = {
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
}


def _sampled(agent: Any, tools: Any) -> Any:
    agent.sample()  # GPM activity needs two samples of each GPU
    return tools.scrape(agent.url)


def test_every_default_counter_is_catalogued_and_exported_by_a_sim_agent(
    start_agent: Any, tools: Any
) -> None:
    fake = FakeNvml(2)
    agent = start_agent(fake)
    fake.emit_xid(1, 13)  # DCGM_EXP_XID_ERRORS_COUNT counts XIDs in its window
    scrape = _sampled(agent, tools)
    health = tools.http("GET", agent.url + "/healthz").json()
    catalogue = load_catalogue()
    counters = tools.dcgm_counters()
    assert len(counters) > 60, "parsed too few rows of default-counters.csv"
    for name, row in counters.items():
        if row.type == "label":
            # Label fields ride on stormwatch_gpu_info under their DCGM names.
            assert name in catalogue["stormwatch_gpu_info"].labels, name
            (labels, _), *_ = scrape.series("stormwatch_gpu_info", gpu="0")
            assert name in labels, name
            continue
        assert name in catalogue, f"{name} ({row.help}) is not in agent/catalogue.csv"
        assert set(DCGM_LABELS) <= set(catalogue[name].labels), name
        for gpu in ("0", "1"):
            exported = scrape.series(name, gpu=gpu)
            marked = scrape.value("stormwatch_metric_supported", gpu=gpu, metric=name)
            assert marked is None, f"{name} marked unsupported on simulated GPU {gpu}"
            if name == "DCGM_EXP_XID_ERRORS_COUNT" and gpu == "0":
                continue  # watched, but no XID on GPU 0: no code to count
            assert exported, f"{name} not exported for simulated GPU {gpu}"
    assert health["unsupported_metrics"] == {}
    # The default driver-version label field, as dcgm-exporter spells it.
    (info, _), *_ = scrape.series("stormwatch_gpu_info", gpu="1")
    assert info["DCGM_FI_DRIVER_VERSION"] == fake.driver_version
    assert info["UUID"] == fake.gpus[1].uuid


def test_unsupported_metrics_are_marked_with_a_reason_and_never_exported_as_zero(
    start_agent: Any, tools: Any
) -> None:
    """An A100-like GPU 0 (no GPM, no NVLink throughput, no memory sensor) next to an H100."""
    fake = FakeNvml(2, links_per_gpu=12)
    old = fake.gpus[0]
    old.gpm_supported = False
    old.vgpu_licensed = None
    old.unsupported_fields = {pynvml.NVML_FI_DEV_MEMORY_TEMP}
    for link in old.links:
        link.throughput_supported = False
    fake.inject_error("nvmlDeviceGetEncoderUtilization", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=0)
    agent = start_agent(fake)
    scrape = _sampled(agent, tools)
    reasons = tools.http("GET", agent.url + "/healthz").json()["unsupported_metrics"]
    unsupported = {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "GPM",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "GPM",
        "DCGM_FI_PROF_DRAM_ACTIVE": "GPM",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "isGridLicenseSupported=0",
        "DCGM_FI_DEV_MEMORY_TEMP": "NVML_FI_DEV_MEMORY_TEMP: NOT_SUPPORTED",
        "DCGM_FI_DEV_ENC_UTIL": "nvmlDeviceGetEncoderUtilization: NOT_SUPPORTED",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "NOT_SUPPORTED on every active link",
    }
    for name, why in unsupported.items():
        assert scrape.series(name, gpu="0") == [], f"{name} exported for an unsupported GPU"
        assert scrape.value("stormwatch_metric_supported", gpu="0", metric=name) == 0, name
        assert why in reasons["0"][name], (name, reasons["0"][name])
        assert scrape.value("stormwatch_metric_supported", gpu="1", metric=name) is None, name
        assert scrape.series(name, gpu="1"), name
    # PCIe rates have an NVML source without GPM: nvmlDeviceGetPcieThroughput.
    assert scrape.value("DCGM_FI_PROF_PCIE_TX_BYTES", gpu="0") > 0
    assert "1" not in reasons
    # Capability answers are not errors.
    assert scrape.series("stormwatch_gpu_nvml_errors_total", gpu="0") == []


def test_fc04_nvlink_error_counters_only_for_active_links_and_supported_counters(
    start_agent: Any, tools: Any
) -> None:
    class Recording(FakeNvml):
        """The simulated NVML, remembering which (field, link) pairs were asked for."""

        requested: list[tuple[int, int]] = []

        def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Any) -> Any:
            self.requested.extend(f if isinstance(f, tuple) else (f, 0) for f in fieldIds)
            return super().nvmlDeviceGetFieldValues(handle, fieldIds)

    fake = Recording(1, links_per_gpu=18)
    links = fake.gpus[0].links
    for link in links[4:]:
        link.active = False  # links 0-3 active
    links[1].errors.update(replay=7, crc_flit=2)
    links[1].legacy_error_fields = True  # pre-Hopper per-link CRC flit/data fields
    links[0].legacy_error_fields = True
    links[3].errors_supported = False
    links[9].errors.update(recovery=5)  # inactive: never read, but NVML's total counts it
    agent = start_agent(fake)
    scrape = tools.scrape(agent.url)

    def errors(link: int, counter: str) -> float | None:
        return scrape.value(
            "stormwatch_nvlink_errors_total", gpu="0", link=str(link), counter=counter
        )

    assert errors(1, "replay") == 7 and errors(1, "crc_flit") == 2 and errors(1, "crc") == 2
    assert errors(0, "recovery") == 0 and errors(0, "crc_data") == 0
    assert errors(2, "crc") == 0 and errors(2, "crc_flit") is None  # Hopper: no legacy fields
    assert scrape.series("stormwatch_nvlink_errors_total", link="3") == []  # NOT_SUPPORTED
    for link in range(4, 18):
        assert scrape.series("stormwatch_nvlink_errors_total", link=str(link)) == []
    replay_scopes = {s for f, s in fake.requested if f == pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY}
    assert replay_scopes == {0, 1, 2, 3}, "error fields must be read for active links only"
    assert scrape.value("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", gpu="0") == 7
    assert scrape.value("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", gpu="0") == 5
    assert scrape.value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", gpu="0") == 2


def test_ecc_remap_and_clock_events_feed_health_status(start_agent: Any, tools: Any) -> None:
    fake = FakeNvml(2)
    agent = start_agent(fake)
    scrape = tools.scrape(agent.url)
    assert scrape.value("DCGM_EXP_GPU_HEALTH_STATUS", gpu="1", health_watch="MEM") == 0
    fake.gpus[1].counters.update(ecc_dbe_vol=1, remap_failure=1, ecc_sbe_agg=9)
    fake.emit_xid(1, 79)
    agent.sample()
    scrape = tools.scrape(agent.url)
    assert scrape.value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="1") == 1
    assert scrape.value("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", gpu="1") == 9
    assert scrape.value("DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="1") == 1
    assert scrape.value("DCGM_EXP_GPU_HEALTH_STATUS", gpu="1", health_watch="MEM") == 20
    assert scrape.value("DCGM_EXP_GPU_HEALTH_STATUS", gpu="1", health_watch="XID") == 20
    assert scrape.value("DCGM_EXP_GPU_HEALTH_STATUS", gpu="0", health_watch="MEM") == 0
    assert scrape.value("DCGM_EXP_XID_ERRORS_COUNT", gpu="1", xid="79") == 1
    # Clock reasons: the bitmask, its decoded form and the windowed event count agree.
    for gpu in ("0", "1"):
        mask = int(scrape.value("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", gpu=gpu) or 0)
        idle = scrape.value("stormwatch_gpu_clocks_event_active", gpu=gpu, reason="gpu_idle")
        assert idle == (1 if mask & pynvml.nvmlClocksEventReasonGpuIdle else 0)
        counts = scrape.series("DCGM_EXP_CLOCK_EVENTS_COUNT", gpu=gpu)
        assert len(counts) == 9 and all(value >= 0 for _, value in counts)


def test_p2p_status_covers_every_pair_of_gpus(start_agent: Any, tools: Any) -> None:
    fake = FakeNvml(3)
    fake.gpus[2].links = []  # a PCIe card: no NVLink P2P to or from it
    agent = start_agent(fake)
    scrape = tools.scrape(agent.url)
    series = scrape.series("DCGM_EXP_P2P_STATUS")
    pairs = {
        (labels["gpu"], labels["peer_gpu"]): (labels["link_status"], v) for labels, v in series
    }
    assert len(pairs) == 6
    assert pairs[("0", "1")] == ("ok", 0)
    assert pairs[("0", "2")][0] == "not_supported" and pairs[("2", "1")][0] == "not_supported"
