"""Immutable results of one GPU sample, served to scrapes without touching NVML."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

#: dcgm-exporter's per-GPU label names, in the order the agent emits them.
DCGM_LABELS: tuple[str, ...] = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")


@dataclasses.dataclass(frozen=True)
class LinkReading:
    """One NVLink link of one GPU.

    Attributes:
        link: link index (the field-value ``scopeId``).
        active: link state; None when NVML could not say (NOT_SUPPORTED / error).
        supported: throughput counters available; None when not asked (inactive link).
        tx_bytes, rx_bytes: cumulative data bytes, None when not available.
    """

    link: int
    active: bool | None
    supported: bool | None = None
    tx_bytes: float | None = None
    rx_bytes: float | None = None


@dataclasses.dataclass(frozen=True)
class NvlinkReading:
    """NVLink view of one GPU; ``present`` False when the GPU has no NVLink at all."""

    present: bool
    links: tuple[LinkReading, ...] = ()


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
        values: DCGM metric name -> value in the catalogue's unit.
        memory_total_bytes: framebuffer size, None when unknown.
        nvlink: None when not sampled (collector off or GPU down).
        processes: None when not sampled or the query failed.
    """

    index: int
    up: bool
    uuid: str = ""
    pci_bus_id: str = ""
    name: str = ""
    values: Mapping[str, float] = dataclasses.field(default_factory=dict)
    memory_total_bytes: int | None = None
    nvlink: NvlinkReading | None = None
    processes: tuple[ProcessEntry, ...] | None = None

    def dcgm_label_values(self, hostname: str) -> list[str]:
        """Values for :data:`DCGM_LABELS`; ``device`` is ``nvidia<index>`` as in dcgm-exporter."""
        return [
            str(self.index),
            self.uuid,
            self.pci_bus_id,
            f"nvidia{self.index}",
            self.name,
            hostname,
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
    """

    taken_at: float
    duration_seconds: float
    device_count: int | None
    devices: tuple[DeviceReading, ...]
    error: str | None
    nvml_errors: Mapping[tuple[str, str, str], int]
    xid_counts: Mapping[tuple[int, int], int]
    last_xid: Mapping[int, tuple[int, float]]


__all__ = [
    "DCGM_LABELS",
    "DeviceReading",
    "GpuSnapshot",
    "LinkReading",
    "NvlinkReading",
    "ProcessEntry",
]
