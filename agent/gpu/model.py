"""Immutable results of one GPU sample, served to scrapes without touching NVML."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from stormwatch.agent.gpu.nvml_errors import Unsupported

#: dcgm-exporter's per-GPU label names, in the order the agent emits them: its
#: template's six, then its default *label* field (default-counters.csv,
#: ``DCGM_FI_DRIVER_VERSION, label``), which dcgm-exporter puts on every series.
DCGM_LABELS: tuple[str, ...] = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
)

#: dcgm-exporter's labels of a MIG GPU instance's series (on top of :data:`DCGM_LABELS`).
MIG_LABELS: tuple[str, ...] = ("GPU_I_PROFILE", "GPU_I_ID")


@dataclasses.dataclass(frozen=True)
class MigReading:
    """One MIG GPU instance of a GPU in MIG mode (dcgm-exporter exports such a GPU
    per instance, never as a whole).

    Attributes:
        gpu_instance_id: ``nvmlDeviceGetGpuInstanceId`` (the ``GPU_I_ID`` label).
        profile: the instance profile, e.g. ``1g.10gb`` (the ``GPU_I_PROFILE`` label).
        uuid: the MIG device's ``MIG-...`` UUID (what the kubelet lists for it).
        values: instance-scoped DCGM metrics (framebuffer) -> value.
    """

    gpu_instance_id: int
    profile: str
    uuid: str
    values: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def label_values(self) -> dict[str, str]:
        """``GPU_I_PROFILE`` and ``GPU_I_ID``, as dcgm-exporter writes them."""
        return {"GPU_I_PROFILE": self.profile, "GPU_I_ID": str(self.gpu_instance_id)}


@dataclasses.dataclass(frozen=True)
class LinkReading:
    """One NVLink link of one GPU.

    Attributes:
        link: link index (the field-value ``scopeId``).
        active: link state; None when NVML could not say (NOT_SUPPORTED / error).
        supported: throughput counters available; None when not asked (inactive link).
        tx_bytes, rx_bytes: cumulative data bytes, None when not available.
        raw_tx_bytes, raw_rx_bytes: cumulative bytes including protocol headers.
        errors: cumulative error counters by name (``crc_flit``, ``crc_data``,
            ``replay``, ``recovery``, ``crc``); only those NVML reports for this link.
    """

    link: int
    active: bool | None
    supported: bool | None = None
    tx_bytes: float | None = None
    rx_bytes: float | None = None
    raw_tx_bytes: float | None = None
    raw_rx_bytes: float | None = None
    errors: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class NvlinkReading:
    """NVLink view of one GPU.

    Attributes:
        present: False when the GPU has no NVLink at all.
        links: one reading per link.
        dcgm: per-GPU DCGM NVLink metrics (bandwidth and error totals) -> value
            in the catalogue's unit, or :class:`Unsupported` with the reason.
    """

    present: bool
    links: tuple[LinkReading, ...] = ()
    dcgm: Mapping[str, float | Unsupported] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ProcessEntry:
    """One ``nvmlDeviceGetComputeRunningProcesses`` entry, unchecked (see FC-06).

    Attributes:
        pid: as reported (may be garbage on a mismatched binding).
        used_bytes: GPU memory in bytes, None when the driver does not say.
    """

    pid: int
    used_bytes: int | None


@dataclasses.dataclass(frozen=True)
class DeviceReading:
    """One GPU in one sample.

    Attributes:
        index: NVML index (the ``gpu`` label).
        up: NVML answered for this GPU (False: lost / no handle, FC-02).
        uuid, pci_bus_id, name: identity labels ("" when unknown).
        values: DCGM metric name -> value in the catalogue's unit (NVLink totals included).
        unsupported: DCGM metric name -> why this GPU cannot report it (NVML said
            NOT_SUPPORTED, or there is no NVML equivalent): exported as
            ``stormwatch_metric_supported 0``, never as a zero value.
        supported: DCGM metric names this GPU produced data for in this sample
            (``values`` keys plus derived families such as ``DCGM_EXP_P2P_STATUS``).
        info: dcgm-exporter "label" fields (``DCGM_FI_DRIVER_VERSION``...) -> value.
        memory_total_bytes: framebuffer size, None when unknown.
        nvlink: None when not sampled (collector off or GPU down).
        processes: None when not sampled or the query failed.
        mig: the GPU's MIG instances (empty: MIG off or not supported).
    """

    index: int
    up: bool
    uuid: str = ""
    pci_bus_id: str = ""
    name: str = ""
    values: Mapping[str, float] = dataclasses.field(default_factory=dict)
    unsupported: Mapping[str, str] = dataclasses.field(default_factory=dict)
    supported: frozenset[str] = frozenset()
    info: Mapping[str, str] = dataclasses.field(default_factory=dict)
    memory_total_bytes: int | None = None
    nvlink: NvlinkReading | None = None
    processes: tuple[ProcessEntry, ...] | None = None
    mig: tuple[MigReading, ...] = ()

    @property
    def device(self) -> str:
        """dcgm-exporter's ``device`` label, the device node name: ``nvidia<index>``."""
        return f"nvidia{self.index}"

    def dcgm_label_values(self, hostname: str) -> list[str]:
        """Values for :data:`DCGM_LABELS`."""
        return [
            str(self.index),
            self.uuid,
            self.pci_bus_id,
            self.device,
            self.name,
            hostname,
            self.info.get("DCGM_FI_DRIVER_VERSION", ""),
        ]


@dataclasses.dataclass(frozen=True)
class GpuSnapshot:
    """Everything one sample produced, plus the sampler's running totals.

    Attributes:
        taken_at: Unix time the sample finished.
        duration_seconds: how long the sample took.
        device_count: ``nvmlDeviceGetCount`` (None when it failed).
        devices: readings by index.
        error: node-wide failure (e.g. ``nvmlDeviceGetCount: UNKNOWN``), else None.
        nvml_errors: cumulative failed calls by (gpu index or "", function, error name).
        xid_counts: cumulative XID events by (gpu index, XID code).
        last_xid: gpu index -> (XID code, Unix time seen).
        xid_events: recent XID events ``(gpu, code, Unix time)``, oldest first (bounded).
        clock_events: recent clock-event onsets ``(gpu, reason, Unix time)``: a
            reason that became active between two samples (bounded).
        p2p: NVLink peer-to-peer status by (gpu, peer gpu), NVML's
            ``NVML_P2P_STATUS_*`` code (refreshed every ``p2p_interval`` seconds).
    """

    taken_at: float
    duration_seconds: float
    device_count: int | None
    devices: tuple[DeviceReading, ...]
    error: str | None
    nvml_errors: Mapping[tuple[str, str, str], int]
    xid_counts: Mapping[tuple[int, int], int]
    last_xid: Mapping[int, tuple[int, float]]
    xid_events: tuple[tuple[int, int, float], ...] = ()
    clock_events: tuple[tuple[int, str, float], ...] = ()
    p2p: Mapping[tuple[int, int], int] = dataclasses.field(default_factory=dict)


__all__ = [
    "DCGM_LABELS",
    "MIG_LABELS",
    "DeviceReading",
    "GpuSnapshot",
    "LinkReading",
    "MigReading",
    "NvlinkReading",
    "ProcessEntry",
]
