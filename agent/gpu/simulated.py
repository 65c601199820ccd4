"""Simulated hardware shapes and opaque handles used by :class:`~stormwatch.agent.gpu.fake.FakeNvml`."""

from __future__ import annotations

import dataclasses
from typing import Any

import pynvml

_GIB = 1024**3


@dataclasses.dataclass
class SimLink:
    """One simulated NVLink link.

    Attributes:
        active: what ``nvmlDeviceGetNvLinkState`` reports.
        throughput_supported: False makes the throughput field values come back
            with ``NVML_ERROR_NOT_SUPPORTED`` (A100-style, FC-04).
        kib_per_second: simulated data rate of each direction.
        errors: cumulative error counters (``crc_flit``, ``crc_data``, ``replay``,
            ``recovery``) served through the per-link NVML fields; tests bump them.
        errors_supported: False makes the per-link error fields NOT_SUPPORTED.
        legacy_error_fields: serve the pre-Hopper per-link CRC flit/data fields
            (``NVML_FI_DEV_NVLINK_CRC_*_ERROR_COUNT_L<n>``); off like on an H100,
            which reports per-link CRC errors through ``NVML_FI_DEV_NVLINK_ERROR_DL_CRC``.
    """

    active: bool = True
    throughput_supported: bool = True
    kib_per_second: float = 1_000_000.0
    errors: dict[str, int] = dataclasses.field(
        default_factory=lambda: {"crc_flit": 0, "crc_data": 0, "replay": 0, "recovery": 0}
    )
    errors_supported: bool = True
    legacy_error_fields: bool = False


@dataclasses.dataclass
class SimGpu:
    """One simulated GPU (mutable: tests reshape it while the agent runs).

    Attributes:
        index: NVML index.
        name: model name (``modelName`` label).
        uuid: ``GPU-<uuid>``; stable across runs for a given index.
        pci_bus_id: ``00000000:BB:00.0``.
        memory_total: framebuffer bytes (80 GiB, an H100 SXM).
        links: NVLink links (18 on an H100 SXM); empty for a GPU without NVLink.
        processes: ``(pid, usedGpuMemory bytes or None)`` entries returned by
            ``nvmlDeviceGetComputeRunningProcesses``, verbatim (they may be bogus: FC-06).
        lost: every call for this GPU raises ``NVMLError_GpuIsLost`` (FC-02).
        counters: device error counters served as NVML fields (ECC, retired
            pages, remapped rows, PCIe replays); tests bump them.
        unsupported_fields: ``NVML_FI_DEV_*`` ids answered NOT_SUPPORTED per entry.
        gpm_supported: False makes ``nvmlGpmQueryDeviceSupport`` say "no GPM"
            (an A100: the profiling metrics become unsupported).
        vgpu_licensed: vGPU license state; None for a GPU without vGPU licensing.
        forced_clock_events: ``nvmlClocksEventReason*`` bits OR-ed into the simulated
            throttle reasons (chaos ``gpu_throttle``).
        power_limit_mw: the power management limit (milliwatts, default 700 W: H100 SXM).
        power_limit_range_mw: (min, max) settable limit.
        locked_clocks_mhz: (min, max) graphics clock lock, None when unlocked.
    """

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total: int = 80 * _GIB
    links: list[SimLink] = dataclasses.field(default_factory=list)
    processes: list[tuple[int, int | None]] = dataclasses.field(default_factory=list)
    lost: bool = False
    counters: dict[str, int] = dataclasses.field(
        default_factory=lambda: {
            "ecc_sbe_vol": 0,
            "ecc_dbe_vol": 0,
            "ecc_sbe_agg": 2,
            "ecc_dbe_agg": 0,
            "retired_sbe": 0,
            "retired_dbe": 0,
            "retired_pending": 0,
            "remapped_cor": 1,
            "remapped_unc": 0,
            "remap_failure": 0,
            "pcie_replay": 0,
        }
    )
    unsupported_fields: set[int] = dataclasses.field(default_factory=set)
    gpm_supported: bool = True
    vgpu_licensed: bool | None = True
    forced_clock_events: int = 0
    power_limit_mw: int = 700_000
    power_limit_range_mw: tuple[int, int] = (200_000, 700_000)
    locked_clocks_mhz: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class FakeHandle:
    """Opaque device handle (stands in for pynvml's ``c_nvmlDevice_t``)."""

    index: int


@dataclasses.dataclass(frozen=True)
class FakeEventSet:
    """Opaque event-set handle (stands in for ``c_nvmlEventSet_t``)."""

    serial: int


@dataclasses.dataclass(frozen=True)
class FakeEventData:
    """What ``nvmlEventSetWait`` returns; same attribute names as ``c_nvmlEventData_t``."""

    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class SimControls:
    """NVML setters and getters of power limits and clock locks on :class:`SimGpu` state.

    Mixed into :class:`~stormwatch.agent.gpu.fake.FakeNvml`; names and units as in
    pynvml (milliwatts, MHz). Setting needs root on a real GPU; the simulation
    always allows it, and rejects values out of range like NVML
    (``NVML_ERROR_INVALID_ARGUMENT``).
    """

    gpus: list[SimGpu]
    _queues: dict[int, Any]

    def pending_events(self) -> int:
        """Events delivered to event sets and not read yet (``nvmlEventSetWait``)."""
        return sum(len(queue) for queue in self._queues.values())

    def _enter(self, call: str, gpu: int | None = None, *, needs_init: bool = True) -> None:
        raise NotImplementedError  # provided by FakeNvml

    def _gpu(self, handle: Any) -> int:
        raise NotImplementedError  # provided by FakeNvml

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetPowerManagementLimit", index)
        return self.gpus[index].power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetPowerManagementLimitConstraints", index)
        return list(self.gpus[index].power_limit_range_mw)

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None:
        index = self._gpu(handle)
        self._enter("nvmlDeviceSetPowerManagementLimit", index)
        low, high = self.gpus[index].power_limit_range_mw
        if not low <= limit <= high:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.gpus[index].power_limit_mw = int(limit)

    def nvmlDeviceSetGpuLockedClocks(
        self, handle: Any, minGpuClockMHz: int, maxGpuClockMHz: int
    ) -> None:
        index = self._gpu(handle)
        self._enter("nvmlDeviceSetGpuLockedClocks", index)
        if not 0 < minGpuClockMHz <= maxGpuClockMHz:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.gpus[index].locked_clocks_mhz = (minGpuClockMHz, maxGpuClockMHz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        index = self._gpu(handle)
        self._enter("nvmlDeviceResetGpuLockedClocks", index)
        self.gpus[index].locked_clocks_mhz = None


__all__ = ["FakeEventData", "FakeEventSet", "FakeHandle", "SimControls", "SimGpu", "SimLink"]
