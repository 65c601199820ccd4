"""Choosing and opening the NVML backend: the real ``pynvml`` module or :class:`FakeNvml`.

Both satisfy :class:`NvmlApi`; everything downstream is written against that
protocol only, so the collector code is identical for real and simulated GPUs.
The backend is chosen when the agent starts (never at import time).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol

import pynvml

from stormwatch.agent.errors import NvmlUnavailable
from stormwatch.agent.gpu.fake import FakeNvml

log = logging.getLogger(__name__)


class NvmlApi(Protocol):
    """The NVML functions the agent calls (names and parameters as in ``pynvml``).

    Every function may raise a ``pynvml.NVMLError`` subclass.
    """

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetIndex(self, handle: Any) -> int: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int: ...
    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Sequence[Any]) -> Any: ...
    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any: ...
    def nvmlEventSetFree(self, eventSet: Any) -> None: ...
    def nvmlSystemGetNVMLVersion(self) -> str: ...
    def nvmlDeviceGetBrand(self, handle: Any) -> int: ...
    def nvmlDeviceGetSerial(self, handle: Any) -> str: ...
    def nvmlDeviceGetInforomVersion(self, handle: Any, infoRomObject: int) -> str: ...
    def nvmlDeviceGetInforomImageVersion(self, handle: Any) -> str: ...
    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str: ...
    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]: ...
    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int: ...
    def nvmlDeviceGetGridLicensableFeatures_v4(self, handle: Any) -> Any: ...
    def nvmlDeviceGetP2PStatus(self, device1: Any, device2: Any, p2pIndex: int) -> int: ...
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any: ...
    def nvmlGpmSampleAlloc(self) -> Any: ...
    def nvmlGpmSampleFree(self, gpmSample: Any) -> None: ...
    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any: ...
    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any: ...
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int: ...
    def nvmlDeviceGetAttributes(self, device: Any) -> Any: ...


#: ``none``: ``auto`` found no driver (no GPU; the simulation API with zero devices).
BackendName = Literal["nvml", "sim", "none"]


@dataclasses.dataclass(frozen=True)
class GpuBackend:
    """An initialised NVML backend.

    Attributes:
        name: ``nvml`` (driver) or ``sim`` (:class:`FakeNvml`).
        api: the module-like object to call.
    """

    name: BackendName
    api: NvmlApi


@contextlib.contextmanager
def open_backend(
    choice: Literal["auto", "nvml", "sim"],
    *,
    sim_gpus: int = 2,
    fake: FakeNvml | None = None,
) -> Iterator[GpuBackend]:
    """Initialise NVML (or the simulation) for the duration of the block.

    Args:
        choice: ``nvml`` requires a driver; ``sim`` always simulates; ``auto``
            uses the driver when ``nvmlInit`` succeeds, otherwise none (backend
            ``none``: no GPU, no GPU metric, a warning; never simulated GPUs, which
            would publish healthy devices for a node whose driver is broken).
        sim_gpus: GPUs to simulate with ``sim`` (ignored with ``fake``).
        fake: a prepared :class:`FakeNvml` to use as the simulation (tests).

    Raises:
        NvmlUnavailable: ``choice == "nvml"`` and ``nvmlInit`` failed.
    """
    backend: GpuBackend | None = None
    if choice != "sim":
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            if choice == "nvml":
                raise NvmlUnavailable(
                    f"gpu_backend: nvml requested but nvmlInit failed ({exc}); "
                    "install the NVIDIA driver or use --gpu-backend sim"
                ) from exc
            log.warning(
                "NVML unavailable (%s): this node exports no GPU metrics (gpu_backend "
                "none); use --gpu-backend nvml to make a missing driver an error, or "
                "--gpu-backend sim to simulate GPUs",
                exc,
            )
            backend = GpuBackend("none", FakeNvml(0))
        else:
            backend = GpuBackend("nvml", pynvml)
    if backend is None:
        backend = GpuBackend("sim", fake if fake is not None else FakeNvml(sim_gpus))
    if backend.name != "nvml":
        backend.api.nvmlInit()
    try:
        yield backend
    finally:
        _shutdown(backend)


def _shutdown(backend: GpuBackend) -> None:
    try:
        backend.api.nvmlShutdown()
    except pynvml.NVMLError as exc:
        log.warning("nvmlShutdown failed: %s", exc)


__all__ = ["BackendName", "GpuBackend", "NvmlApi", "open_backend"]
