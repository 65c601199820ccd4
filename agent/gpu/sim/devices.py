"""The simulated GPUs' state (:class:`SimGpu`, :class:`SimLink`) and NVML's opaque handles.

The per-device model that :class:`~stormwatch.agent.gpu.fake.FakeNvml` serves:
identity, memory size, NVLink links, the scripted process list, counters, what
is unsupported, and the settings NVML can change (power limit, clock lock).
Tests and the chaos fault kinds reshape it while the agent runs.
"""

from __future__ import annotations

import dataclasses
import uuid

import pynvml

from stormwatch.agent.gpu.sim.mig import SimMig

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
        mig_mode: MIG mode on (True) or off (False); None for a GPU without MIG
            (``nvmlDeviceGetMigMode`` answers NOT_SUPPORTED).
        mig: MIG instances by slot (None: an empty slot); served while :attr:`mig_mode`.
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
    mig_mode: bool | None = False
    mig: list[SimMig | None] = dataclasses.field(default_factory=list)

    @property
    def serial(self) -> str:
        """The board serial number (``nvmlDeviceGetSerial``), stable per index."""
        return f"16524230{self.index:05d}"

    def set_power_limit(self, limit_mw: int) -> None:
        """``nvmlDeviceSetPowerManagementLimit``: within :attr:`power_limit_range_mw`.

        Raises:
            pynvml.NVMLError: ``NVML_ERROR_INVALID_ARGUMENT`` out of range (as NVML).
        """
        low, high = self.power_limit_range_mw
        if not low <= limit_mw <= high:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.power_limit_mw = int(limit_mw)

    def lock_clocks(self, low_mhz: int, high_mhz: int) -> None:
        """``nvmlDeviceSetGpuLockedClocks``: the graphics and SM clocks stay in ``[low, high]``.

        Raises:
            pynvml.NVMLError: ``NVML_ERROR_INVALID_ARGUMENT`` unless ``0 < low <= high``.
        """
        if not 0 < low_mhz <= high_mhz:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.locked_clocks_mhz = (low_mhz, high_mhz)

    def pci_info(self) -> pynvml.nvmlPciInfo_t:
        """``nvmlDeviceGetPciInfo``'s structure (an H100's PCI device id)."""
        bus_id = self.pci_bus_id
        return pynvml.nvmlPciInfo_t(
            busIdLegacy=bus_id.encode(),
            busId=bus_id.encode(),
            domain=0,
            bus=int(bus_id.split(":")[1], 16),
            device=0,
            pciDeviceId=0x233010DE,
        )

    def licensable_features(self) -> pynvml.c_nvmlGridLicensableFeatures_v4_t:
        """``nvmlDeviceGetGridLicensableFeatures_v4``: one vGPU feature, or none without vGPU."""
        licensed = self.vgpu_licensed
        features = pynvml.c_nvmlGridLicensableFeatures_v4_t()
        features.isGridLicenseSupported = 0 if licensed is None else 1
        if licensed is not None:
            features.licensableFeaturesCount = 1
            feature = features.gridLicensableFeatures[0]
            feature.featureCode = pynvml.NVML_GRID_LICENSE_FEATURE_CODE_VGPU
            feature.featureState = 1 if licensed else 0
            feature.featureEnabled = 1
        return features

    def compute_processes(self) -> list[pynvml.nvmlFriendlyObject]:
        """``nvmlDeviceGetComputeRunningProcesses``: :attr:`processes` verbatim, as pynvml's objects."""
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": used,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            )
            for pid, used in self.processes
        ]


def make_gpus(count: int, *, links_per_gpu: int, model: str) -> list[SimGpu]:
    """``count`` GPUs of ``model``, each with ``links_per_gpu`` NVLink links.

    UUIDs are derived from the index (stable across runs); PCI bus ids start at
    ``0x18`` and step by ``0x10`` (``00000000:18:00.0``, ``00000000:28:00.0``, ...).
    """
    return [
        SimGpu(
            index=i,
            name=model,
            uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_OID, f'stormwatch-sim-gpu-{i}')}",
            pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            links=[SimLink() for _ in range(links_per_gpu)],
        )
        for i in range(count)
    ]


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


__all__ = ["FakeEventData", "FakeEventSet", "FakeHandle", "SimGpu", "SimLink", "make_gpus"]
