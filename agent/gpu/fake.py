"""A simulated NVML: the ``sim`` GPU backend, and the test double for NVML.

:class:`FakeNvml` implements the subset of the ``pynvml`` (nvidia-ml-py)
module the agent calls, with the same function names and parameters, the same
return types (the real ctypes structures where pynvml returns them) and the
same exceptions (``pynvml.NVMLError`` subclasses built from real error codes).
The agent's GPU code cannot tell it from the real module, so every collector
path runs on a machine without a GPU.

It is the NVML face of collaborators with one responsibility each
(:mod:`stormwatch.agent.gpu.sim`): the devices' state (:class:`SimGpu`,
:class:`SimLink`: tests and chaos faults reshape it), the gate every call
passes (counted in :attr:`FakeNvml.calls`, so a test can assert that a
deprecated API was never used, FC-05; any NVML error code injected per
function and per device, :meth:`FakeNvml.inject_error`; a lost GPU, FC-02),
the sensor readings (deterministic functions of the elapsed time on the clock
passed in), the field values, XID events (FC-03), GPM samples and MIG instances
(:meth:`FakeNvml.set_mig`). Each NVML
function here only decodes its handle, passes the gate and asks the
collaborator that owns the answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pynvml

from stormwatch.agent.gpu.sim.calls import CallGate
from stormwatch.agent.gpu.sim.devices import (
    FakeEventData,
    FakeEventSet,
    FakeHandle,
    SimGpu,
    make_gpus,
)
from stormwatch.agent.gpu.sim.events import XidEvents
from stormwatch.agent.gpu.sim.fields import field_values
from stormwatch.agent.gpu.sim.gpm import GpmSamples, fill_metrics
from stormwatch.agent.gpu.sim.mig import MAX_MIG_DEVICES, FakeMigHandle, SimMig, make_mig
from stormwatch.agent.gpu.sim.readings import Readings

#: The legacy NVLink utilisation-counter API, deprecated since CUDA 11 (FC-05):
#: the fake always answers NOT_SUPPORTED, like current drivers do.
LEGACY_NVLINK_FUNCTIONS: frozenset[str] = frozenset(
    {
        "nvmlDeviceGetNvLinkUtilizationCounter",
        "nvmlDeviceSetNvLinkUtilizationControl",
        "nvmlDeviceResetNvLinkUtilizationCounter",
    }
)

#: ``nvmlDeviceGetInforomVersion`` by InfoROM object; the power object is NOT_SUPPORTED (H100).
_INFOROM_VERSIONS = {pynvml.NVML_INFOROM_OEM: "2.1", pynvml.NVML_INFOROM_ECC: "7.16"}

#: Sampling period NVML reports with encoder/decoder utilisation, microseconds.
_CODEC_PERIOD_US = 167_000


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNvml:
    """Simulated NVML with per-device, per-call error injection.

    Args:
        gpus: number of simulated GPUs.
        links_per_gpu: NVLink links per GPU (18 like an H100 SXM; 0 for PCIe cards).
        model: model name of every GPU.
        clock: seconds, monotonic; drives the simulated values.
        driver_version: what ``nvmlSystemGetDriverVersion`` returns.

    Attributes:
        gpus: the simulated devices, by index (mutable: tests reshape them).
        calls: how often each NVML function was called.
        driver_version: what ``nvmlSystemGetDriverVersion`` returns.

    Thread-safe: the agent's sampler thread calls it while tests reshape it.
    """

    def __init__(
        self,
        gpus: int = 2,
        *,
        links_per_gpu: int = 18,
        model: str = "NVIDIA H100 80GB HBM3",
        clock: Callable[[], float] = time.monotonic,
        driver_version: str = "550.54.15",
    ) -> None:
        self.driver_version = driver_version
        self.gpus: list[SimGpu] = make_gpus(gpus, links_per_gpu=links_per_gpu, model=model)
        self._gate = CallGate(NVML_FUNCTIONS, lambda index: self.gpus[index].lost)
        self._readings = Readings(clock)
        self._events = XidEvents()
        self._gpm = GpmSamples()
        self.calls = self._gate.calls

    # ----------------------------------------------------------------- knobs
    def inject_error(
        self, call: str, code: int, *, gpu: int | None = None, times: int | None = None
    ) -> None:
        """Make ``call`` raise ``pynvml.NVMLError(code)``.

        Args:
            call: an NVML function name from :data:`NVML_FUNCTIONS`.
            code: an ``NVML_ERROR_*`` value.
            gpu: only for this device index (None: every device, and node-wide calls).
            times: only this many times (None: until :meth:`clear_errors`).

        Raises:
            ValueError: unknown function name or error code (a typo must not
                silently inject nothing).
        """
        self._gate.inject(call, code, gpu=gpu, times=times)

    def clear_errors(self) -> None:
        """Remove every injected error."""
        self._gate.clear()

    def lose_gpu(self, index: int, lost: bool = True) -> None:
        """Make GPU ``index`` fall off the bus (or come back with ``lost=False``)."""
        self.gpus[index].lost = lost

    def emit_xid(self, index: int, code: int) -> None:
        """Deliver one XID critical-error event for GPU ``index`` to registered event sets."""
        self._events.emit_xid(index, code)

    def set_processes(self, index: int, processes: Sequence[tuple[int, int | None]]) -> None:
        """Script the compute-process list of GPU ``index`` (``(pid, bytes)`` entries)."""
        self.gpus[index].processes = list(processes)

    def set_mig(self, index: int, profiles: Sequence[tuple[int, int]] | None) -> list[SimMig]:
        """Put GPU ``index`` in MIG mode with one instance per ``(slices, memory MiB)``
        (e.g. ``(1, 9856)``: an H100's ``1g.10gb``), or out of it with ``None``.

        Returns:
            the instances, in slot order (tests reshape them, e.g. ``unsupported``).

        Raises:
            ValueError: more than 7 instances.
        """
        gpu = self.gpus[index]
        gpu.mig_mode = profiles is not None
        gpu.mig = make_mig(index, list(profiles or []))
        return [mig for mig in gpu.mig if mig is not None]

    def pending_events(self) -> int:
        """Events delivered to event sets and not read yet (``nvmlEventSetWait``)."""
        return self._events.pending()

    # --------------------------------------------------------------- helpers
    def _index(self, handle: Any) -> int:
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.index

    def _handle(self, call: str, handle: Any) -> tuple[SimGpu, SimMig | None]:
        """The GPU of ``handle`` (checked first) and, for a MIG device handle, its
        instance, once ``call`` has passed the gate (under the parent GPU's index)."""
        mig_slot = handle.slot if isinstance(handle, FakeMigHandle) else None
        if mig_slot is not None:
            handle = FakeHandle(handle.index)
        index = self._index(handle)
        self._gate.enter(call, index)
        gpu = self.gpus[index]
        if mig_slot is None:
            return gpu, None
        mig = gpu.mig[mig_slot] if gpu.mig_mode and mig_slot < len(gpu.mig) else None
        if mig is None:  # the instance was destroyed since the handle was taken
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if call in mig.unsupported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu, mig

    def _device(self, call: str, handle: Any) -> SimGpu:
        """The whole GPU of ``handle``; NOT_SUPPORTED for a MIG device (as NVML's
        whole-GPU readings are)."""
        gpu, mig = self._handle(call, handle)
        if mig is not None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _mig(self, call: str, handle: Any) -> SimMig:
        """The MIG instance of a MIG device ``handle``; NOT_SUPPORTED for a whole GPU."""
        _gpu, mig = self._handle(call, handle)
        if mig is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return mig

    # ------------------------------------------------------ NVML: lifecycle
    def nvmlInit(self) -> None:
        self._gate.enter("nvmlInit", needs_init=False)
        self._gate.opened(+1)

    def nvmlInitWithFlags(self, flags: int) -> None:
        self._gate.enter("nvmlInitWithFlags", needs_init=False)
        self._gate.opened(+1)

    def nvmlShutdown(self) -> None:
        self._gate.enter("nvmlShutdown")
        self._gate.opened(-1)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._gate.enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._gate.enter("nvmlSystemGetNVMLVersion")
        return "12.550.54.15"

    # ----------------------------------------------------- NVML: identity
    def nvmlDeviceGetCount(self) -> int:
        self._gate.enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        if not 0 <= index < len(self.gpus):
            self._gate.enter("nvmlDeviceGetHandleByIndex")
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gate.enter("nvmlDeviceGetHandleByIndex", index)
        return FakeHandle(index)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetIndex", handle).index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu, mig = self._handle("nvmlDeviceGetUUID", handle)
        return gpu.uuid if mig is None else mig.uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        return self._device("nvmlDeviceGetPciInfo", handle).pci_info()

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        self._device("nvmlDeviceGetBrand", handle)
        return int(pynvml.NVML_BRAND_NVIDIA)

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetSerial", handle).serial

    def nvmlDeviceGetInforomVersion(self, handle: Any, infoRomObject: int) -> str:
        """OEM and ECC objects answer; the power object is NOT_SUPPORTED (as on an H100)."""
        self._device("nvmlDeviceGetInforomVersion", handle)
        if infoRomObject not in _INFOROM_VERSIONS:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _INFOROM_VERSIONS[infoRomObject]

    def nvmlDeviceGetInforomImageVersion(self, handle: Any) -> str:
        self._device("nvmlDeviceGetInforomImageVersion", handle)
        return "G520.0200.00.05"

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        self._device("nvmlDeviceGetVbiosVersion", handle)
        return "96.00.99.00.01"

    def nvmlDeviceGetGridLicensableFeatures_v4(self, handle: Any) -> Any:
        return self._device("nvmlDeviceGetGridLicensableFeatures_v4", handle).licensable_features()

    # ------------------------------------------------------ NVML: readings
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> pynvml.c_nvmlUtilization_t:
        """NOT_SUPPORTED in MIG mode, as NVML (per-instance utilisation is a DCGM profiling metric)."""
        gpu = self._device("nvmlDeviceGetUtilizationRates", handle)
        if gpu.mig_mode:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._readings.utilization_rates(gpu)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu, mig = self._handle("nvmlDeviceGetMemoryInfo", handle)
        total = None if mig is None else mig.memory_mb * 1024 * 1024
        return self._readings.memory_info(gpu, version, total)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._device("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._readings.temperature(gpu)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """Milliwatts, like NVML."""
        return self._readings.power_mw(self._device("nvmlDeviceGetPowerUsage", handle))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        """Millijoules since "boot" (the fake's creation), like NVML."""
        gpu = self._device("nvmlDeviceGetTotalEnergyConsumption", handle)
        return self._readings.energy_mj(gpu)

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        """MHz, like NVML."""
        return self._readings.clock_mhz(self._device("nvmlDeviceGetClockInfo", handle), type)

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        """``[percent, sampling period in us]``: training jobs leave NVENC idle."""
        self._device("nvmlDeviceGetEncoderUtilization", handle)
        return [0, _CODEC_PERIOD_US]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        gpu = self._device("nvmlDeviceGetDecoderUtilization", handle)
        return [self._readings.decoder_percent(gpu), _CODEC_PERIOD_US]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        """Idle below 10 % utilisation, power-capped above 88 %."""
        gpu = self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return self._readings.clock_events(gpu)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        """The pre-R535 name of :meth:`nvmlDeviceGetCurrentClocksEventReasons`."""
        gpu = self._device("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return self._readings.clock_events(gpu)

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        """KB/s over NVML's 20 ms window."""
        gpu = self._device("nvmlDeviceGetPcieThroughput", device)
        return self._readings.pcie_kb_per_s(gpu, counter)

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Sequence[Any]) -> Any:
        """Real ``c_nvmlFieldValue_t`` array with a per-entry ``nvmlReturn``
        (:func:`stormwatch.agent.gpu.sim.fields.field_values`)."""
        gpu = self._device("nvmlDeviceGetFieldValues", handle)
        elapsed = self._readings.elapsed()
        temperature = self._readings.temperature(gpu)
        return field_values(gpu, fieldIds, elapsed=elapsed, temperature=temperature)

    # ------------------------------------------------------ NVML: settings
    # Names and units as in pynvml (milliwatts, MHz). Setting needs root on a real GPU;
    # the simulation always allows it, and rejects values out of range like NVML.
    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetPowerManagementLimit", handle).power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        gpu = self._device("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return list(gpu.power_limit_range_mw)

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None:
        self._device("nvmlDeviceSetPowerManagementLimit", handle).set_power_limit(limit)

    def nvmlDeviceSetGpuLockedClocks(
        self, handle: Any, minGpuClockMHz: int, maxGpuClockMHz: int
    ) -> None:
        gpu = self._device("nvmlDeviceSetGpuLockedClocks", handle)
        gpu.lock_clocks(minGpuClockMHz, maxGpuClockMHz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        self._device("nvmlDeviceResetGpuLockedClocks", handle).locked_clocks_mhz = None

    # -------------------------------------------------------- NVML: NVLink
    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        links = self._device("nvmlDeviceGetNvLinkState", device).links
        if not links:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(links):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if links[link].active else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkUtilizationCounter(self, device: Any, link: int, counter: int) -> Any:
        """Deprecated since CUDA 11; NOT_SUPPORTED like current drivers (FC-05)."""
        self._device("nvmlDeviceGetNvLinkUtilizationCounter", device)
        raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceSetNvLinkUtilizationControl(
        self, device: Any, link: int, counter: int, control: Any, reset: int
    ) -> None:
        """Deprecated since CUDA 11; NOT_SUPPORTED like current drivers (FC-05)."""
        self._device("nvmlDeviceSetNvLinkUtilizationControl", device)
        raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceResetNvLinkUtilizationCounter(self, device: Any, link: int, counter: int) -> None:
        """Deprecated since CUDA 11; NOT_SUPPORTED like current drivers (FC-05)."""
        self._device("nvmlDeviceResetNvLinkUtilizationCounter", device)
        raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetP2PStatus(self, device1: Any, device2: Any, p2pIndex: int) -> int:
        """OK between two GPUs with NVLink, NOT_SUPPORTED (a status, not an error) otherwise."""
        first, second = self._index(device1), self._index(device2)
        self._gate.enter("nvmlDeviceGetP2PStatus", first)
        if p2pIndex == pynvml.NVML_P2P_CAPS_INDEX_NVLINK and not (
            self.gpus[first].links and self.gpus[second].links
        ):
            return int(pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)
        return int(pynvml.NVML_P2P_STATUS_OK)

    # ----------------------------------------------------- NVML: processes
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """``nvmlFriendlyObject`` entries with ``pid`` and ``usedGpuMemory`` (bytes or None)."""
        return self._device("nvmlDeviceGetComputeRunningProcesses", handle).compute_processes()

    # ----------------------------------------------------------- NVML: MIG
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        """``[current, pending]``; NOT_SUPPORTED on a GPU without MIG."""
        gpu = self._device("nvmlDeviceGetMigMode", device)
        if gpu.mig_mode is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_mode else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._device("nvmlDeviceGetMaxMigDeviceCount", device)
        if gpu.mig_mode is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> FakeMigHandle:
        """NOT_FOUND for an empty slot (or MIG off), INVALID_ARGUMENT past the last slot."""
        gpu = self._device("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if not 0 <= index < MAX_MIG_DEVICES:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not gpu.mig_mode or index >= len(gpu.mig) or gpu.mig[index] is None:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return FakeMigHandle(gpu.index, index)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig("nvmlDeviceGetGpuInstanceId", device).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._mig("nvmlDeviceGetComputeInstanceId", device).compute_instance_id

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        """MIG device handles only, as NVML documents."""
        return self._mig("nvmlDeviceGetAttributes", device).attributes()

    # -------------------------------------------------------- NVML: events
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._device("nvmlDeviceGetSupportedEventTypes", handle)
        return pynvml.nvmlEventTypeXidCriticalError

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._gate.enter("nvmlEventSetCreate")
        return self._events.create()

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._device("nvmlDeviceRegisterEvents", handle)
        self._events.register(eventSet, gpu.index, eventTypes)

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> FakeEventData:
        """Next event, waiting up to ``timeoutms``; ``NVMLError_Timeout`` when none came."""
        self._gate.enter("nvmlEventSetWait")
        return self._events.wait(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._gate.enter("nvmlEventSetFree")
        self._events.free(eventSet)

    # ----------------------------------------------------------- NVML: GPM
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        gpu = self._device("nvmlGpmQueryDeviceSupport", device)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if gpu.gpm_supported else 0
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._gate.enter("nvmlGpmSampleAlloc")
        return self._gpm.alloc()

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._gate.enter("nvmlGpmSampleFree")
        self._gpm.free(gpmSample)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        gpu = self._device("nvmlGpmSampleGet", device)
        if not gpu.gpm_supported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._gpm.take(gpmSample, gpu.index)

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        """Fills ``metrics[i].value`` / ``nvmlReturn`` from the two samples' GPU."""
        first, second = self._gpm.devices(metricsGet)
        self._gate.enter("nvmlGpmMetricsGet", second)
        if first is None or second is None or first != second:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return fill_metrics(metricsGet, self._readings.utilisation(self.gpus[second]))


#: Every NVML function :class:`FakeNvml` implements: the names ``inject_error`` accepts.
NVML_FUNCTIONS: tuple[str, ...] = tuple(name for name in vars(FakeNvml) if name.startswith("nvml"))


__all__ = ["LEGACY_NVLINK_FUNCTIONS", "NVML_FUNCTIONS", "FakeNvml"]
