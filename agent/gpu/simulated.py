"""Simulated hardware shapes and opaque handles used by :class:`~stormwatch.agent.gpu.fake.FakeNvml`."""

from __future__ import annotations

import dataclasses

_GIB = 1024**3


@dataclasses.dataclass
class SimLink:
    """One simulated NVLink link.

    Attributes:
        active: what ``nvmlDeviceGetNvLinkState`` reports.
        throughput_supported: False makes the throughput field values come back
            with ``NVML_ERROR_NOT_SUPPORTED`` (A100-style, FC-04).
        kib_per_second: simulated data rate of each direction.
    """

    active: bool = True
    throughput_supported: bool = True
    kib_per_second: float = 1_000_000.0


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
    """

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total: int = 80 * _GIB
    links: list[SimLink] = dataclasses.field(default_factory=list)
    processes: list[tuple[int, int | None]] = dataclasses.field(default_factory=list)
    lost: bool = False


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


__all__ = ["FakeEventData", "FakeEventSet", "FakeHandle", "SimGpu", "SimLink"]
