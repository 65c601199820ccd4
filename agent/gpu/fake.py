"""A simulated NVML: the ``sim`` GPU backend, and the test double for NVML.

:class:`FakeNvml` implements the subset of the ``pynvml`` (nvidia-ml-py)
module the agent calls, with the same function names and parameters, the same
return types (the real ctypes structures where pynvml returns them) and the
same exceptions (``pynvml.NVMLError`` subclasses built from real error codes).
The agent's GPU code cannot tell it from the real module, so every collector
path runs on a machine without a GPU.

Beyond the NVML functions it has knobs to shape the simulated hardware
(:class:`SimGpu`, :class:`SimLink`), to inject any NVML error code per call and
per device (:meth:`FakeNvml.inject_error`), to lose a GPU (FC-02), to emit XID
events (FC-03) and to script the process list (FC-06). Every NVML call is
counted in :attr:`FakeNvml.calls`, so a test can assert that a deprecated API
was never used (FC-05).

Values are deterministic functions of the elapsed time on the clock passed in.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pynvml

from stormwatch.agent.gpu.fake_extras import FakeNvmlExtras
from stormwatch.agent.gpu.fake_fields import fill_field, set_field
from stormwatch.agent.gpu.simulated import (
    FakeEventData,
    FakeEventSet,
    FakeHandle,
    SimControls,
    SimGpu,
    SimLink,
)

#: NVML functions :class:`FakeNvml` implements (the names checked by ``inject_error``).
NVML_FUNCTIONS: tuple[str, ...] = (
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkUtilizationCounter",
    "nvmlDeviceSetNvLinkUtilizationControl",
    "nvmlDeviceResetNvLinkUtilizationCounter",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetCreate",
    "nvmlEventSetWait",
    "nvmlEventSetFree",
    "nvmlSystemGetNVMLVersion",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetInforomVersion",
    "nvmlDeviceGetInforomImageVersion",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetEncoderUtilization",
    "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetGridLicensableFeatures_v4",
    "nvmlDeviceGetP2PStatus",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
)

#: The legacy NVLink utilisation-counter API, deprecated since CUDA 11 (FC-05):
#: the fake always answers NOT_SUPPORTED, like current drivers do.
LEGACY_NVLINK_FUNCTIONS: frozenset[str] = frozenset(
    {
        "nvmlDeviceGetNvLinkUtilizationCounter",
        "nvmlDeviceSetNvLinkUtilizationControl",
        "nvmlDeviceResetNvLinkUtilizationCounter",
    }
)

_THROUGHPUT_FIELDS = {
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: ("tx", 1.0),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: ("rx", 1.0),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: ("tx", 1.08),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: ("rx", 1.08),
}


@dataclasses.dataclass
class _ErrorRule:
    call: str
    code: int
    gpu: int | None
    remaining: int | None


class FakeNvml(FakeNvmlExtras, SimControls):
    """Simulated NVML with per-device, per-call error injection.

    Args:
        gpus: number of simulated GPUs.
        links_per_gpu: NVLink links per GPU (18 like an H100 SXM; 0 for PCIe cards).
        model: model name of every GPU.
        clock: seconds, monotonic; drives the simulated values.
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
        self._lock = threading.RLock()
        self._events = threading.Condition(self._lock)
        self._clock = clock
        self._t0 = clock()
        self._init_count = 0
        self._rules: list[_ErrorRule] = []
        self._event_sets: dict[int, dict[int, int]] = {}  # serial -> {gpu: mask}
        self._queues: dict[int, collections.deque[FakeEventData]] = {}
        self._next_set = 1
        self._gpm_samples: dict[int, tuple[Any, int | None]] = {}
        self.driver_version = driver_version
        self.calls: collections.Counter[str] = collections.Counter()
        self.gpus: list[SimGpu] = [
            SimGpu(
                index=i,
                name=model,
                uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_OID, f'stormwatch-sim-gpu-{i}')}",
                pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                links=[SimLink() for _ in range(links_per_gpu)],
            )
            for i in range(gpus)
        ]

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
        if call not in NVML_FUNCTIONS:
            raise ValueError(f"unknown NVML function {call!r}; known: {', '.join(NVML_FUNCTIONS)}")
        if code not in pynvml.NVMLError._valClassMapping:
            raise ValueError(f"unknown NVML error code {code}")
        with self._lock:
            self._rules.append(_ErrorRule(call, code, gpu, times))

    def clear_errors(self) -> None:
        """Remove every injected error."""
        with self._lock:
            self._rules.clear()

    def lose_gpu(self, index: int, lost: bool = True) -> None:
        """Make GPU ``index`` fall off the bus (or come back with ``lost=False``)."""
        with self._lock:
            self.gpus[index].lost = lost

    def emit_xid(self, index: int, code: int) -> None:
        """Deliver one XID critical-error event for GPU ``index`` to registered event sets."""
        with self._events:
            for serial, masks in self._event_sets.items():
                if masks.get(index, 0) & pynvml.nvmlEventTypeXidCriticalError:
                    self._queues[serial].append(
                        FakeEventData(FakeHandle(index), pynvml.nvmlEventTypeXidCriticalError, code)
                    )
            self._events.notify_all()

    def set_processes(self, index: int, processes: Sequence[tuple[int, int | None]]) -> None:
        """Script the compute-process list of GPU ``index`` (``(pid, bytes)`` entries)."""
        with self._lock:
            self.gpus[index].processes = list(processes)

    # --------------------------------------------------------------- helpers
    def _enter(self, call: str, gpu: int | None = None, *, needs_init: bool = True) -> None:
        with self._lock:
            self.calls[call] += 1
            if needs_init and self._init_count == 0:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
            for rule in self._rules:
                if rule.call != call or (rule.gpu is not None and rule.gpu != gpu):
                    continue
                if rule.remaining is not None:
                    if rule.remaining <= 0:
                        continue
                    rule.remaining -= 1
                raise pynvml.NVMLError(rule.code)
            if gpu is not None and self.gpus[gpu].lost:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def _gpu(self, handle: Any) -> int:
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handle.index

    def _elapsed(self) -> float:
        return max(0.0, self._clock() - self._t0)

    def _util(self, index: int) -> int:
        return int(50 + 45 * math.sin(self._elapsed() / 7.0 + index))

    def _used_memory(self, index: int) -> int:
        gpu = self.gpus[index]
        share = 0.35 + 0.25 * math.sin(self._elapsed() / 11.0 + index)
        return int(gpu.memory_total * share)

    # ------------------------------------------------------ NVML: lifecycle
    def nvmlInit(self) -> None:
        self._enter("nvmlInit", needs_init=False)
        with self._lock:
            self._init_count += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self._enter("nvmlInitWithFlags", needs_init=False)
        with self._lock:
            self._init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        with self._lock:
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    # -------------------------------------------------------- NVML: devices
    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        if not 0 <= index < len(self.gpus):
            self._enter("nvmlDeviceGetHandleByIndex")
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._enter("nvmlDeviceGetHandleByIndex", index)
        return FakeHandle(index)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetIndex", index)
        return index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetUUID", index)
        return self.gpus[index].uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetPciInfo", index)
        bus_id = self.gpus[index].pci_bus_id
        return pynvml.nvmlPciInfo_t(
            busIdLegacy=bus_id.encode(),
            busId=bus_id.encode(),
            domain=0,
            bus=int(bus_id.split(":")[1], 16),
            device=0,
            pciDeviceId=0x233010DE,
        )

    def nvmlDeviceGetName(self, handle: Any) -> str:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetName", index)
        return self.gpus[index].name

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> pynvml.c_nvmlUtilization_t:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetUtilizationRates", index)
        util = self._util(index)
        return pynvml.c_nvmlUtilization_t(gpu=util, memory=util // 2)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetMemoryInfo", index)
        total = self.gpus[index].memory_total
        used = self._used_memory(index)
        if version:
            reserved = 512 * 1024 * 1024
            return pynvml.c_nvmlMemory_v2_t(
                version=version,
                total=total,
                reserved=reserved,
                free=total - used - reserved,
                used=used,
            )
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetTemperature", index)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 35 + self._util(index) * 2 // 5

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """Milliwatts, like NVML."""
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetPowerUsage", index)
        return (90 + 5 * self._util(index)) * 1000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        """Millijoules since "boot" (the fake's creation), like NVML."""
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetTotalEnergyConsumption", index)
        return int(self._elapsed() * 350_000) + index * 10**9

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        """MHz, like NVML."""
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetClockInfo", index)
        clocks = {
            pynvml.NVML_CLOCK_GRAPHICS: 1980,
            pynvml.NVML_CLOCK_SM: 1980 if self._util(index) > 5 else 345,
            pynvml.NVML_CLOCK_MEM: 2619,
            pynvml.NVML_CLOCK_VIDEO: 1545,
        }
        if type not in clocks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        locked = self.gpus[index].locked_clocks_mhz  # nvmlDeviceSetGpuLockedClocks caps them
        if locked is not None and type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
            return min(clocks[type], locked[1])
        return clocks[type]

    # --------------------------------------------------------- NVML: NVLink
    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Sequence[Any]) -> Any:
        """Real ``c_nvmlFieldValue_t`` array with a per-entry ``nvmlReturn``.

        Supported: NVLink link count, throughput (scope = link) and error
        counters (per-link, scoped and totals), the device fields of
        :mod:`.fake_fields` (ECC, retired pages, remapped rows, PCIe replays,
        memory temperature, violation timers). Anything else, and the ids in
        ``SimGpu.unsupported_fields``, come back NOT_SUPPORTED per entry.
        """
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetFieldValues", index)
        gpu = self.gpus[index]
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        now_us = int(time.time() * 1e6)
        elapsed = self._elapsed()
        temperature = 35 + self._util(index) * 2 // 5
        for i, field in enumerate(fieldIds):
            field_id, scope = field if isinstance(field, tuple) else (field, 0)
            entry = values[i]
            set_field(entry, "fieldId", field_id)
            set_field(entry, "scopeId", scope)
            set_field(entry, "timestamp", now_us)
            if field_id not in _THROUGHPUT_FIELDS:
                fill_field(entry, gpu, field_id, scope, elapsed, temperature)
                continue
            set_field(entry, "nvmlReturn", pynvml.NVML_ERROR_NOT_SUPPORTED)
            if not 0 <= scope < len(gpu.links):
                set_field(entry, "nvmlReturn", pynvml.NVML_ERROR_INVALID_ARGUMENT)
                continue
            link = gpu.links[scope]
            if not link.throughput_supported or field_id in gpu.unsupported_fields:
                continue
            _, overhead = _THROUGHPUT_FIELDS[field_id]
            kib = link.kib_per_second * elapsed * overhead if link.active else 0.0
            set_field(entry, "valueType", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
            entry.value.ullVal = int(kib)
            set_field(entry, "nvmlReturn", pynvml.NVML_SUCCESS)
        return values

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        index = self._gpu(device)
        self._enter("nvmlDeviceGetNvLinkState", index)
        links = self.gpus[index].links
        if not links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if links[link].active else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkUtilizationCounter(self, device: Any, link: int, counter: int) -> Any:
        """Deprecated since CUDA 11; NOT_SUPPORTED like current drivers (FC-05)."""
        self._enter("nvmlDeviceGetNvLinkUtilizationCounter", self._gpu(device))
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceSetNvLinkUtilizationControl(
        self, device: Any, link: int, counter: int, control: Any, reset: int
    ) -> None:
        """Deprecated since CUDA 11; NOT_SUPPORTED like current drivers (FC-05)."""
        self._enter("nvmlDeviceSetNvLinkUtilizationControl", self._gpu(device))
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceResetNvLinkUtilizationCounter(self, device: Any, link: int, counter: int) -> None:
        """Deprecated since CUDA 11; NOT_SUPPORTED like current drivers (FC-05)."""
        self._enter("nvmlDeviceResetNvLinkUtilizationCounter", self._gpu(device))
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # ------------------------------------------------------ NVML: processes
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """``nvmlFriendlyObject`` entries with ``pid`` and ``usedGpuMemory`` (bytes or None)."""
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetComputeRunningProcesses", index)
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": used,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            )
            for pid, used in self.gpus[index].processes
        ]

    # --------------------------------------------------------- NVML: events
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        index = self._gpu(handle)
        self._enter("nvmlDeviceGetSupportedEventTypes", index)
        return pynvml.nvmlEventTypeXidCriticalError

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._enter("nvmlEventSetCreate")
        with self._lock:
            serial = self._next_set
            self._next_set += 1
            self._event_sets[serial] = {}
            self._queues[serial] = collections.deque()
        return FakeEventSet(serial)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        index = self._gpu(handle)
        self._enter("nvmlDeviceRegisterEvents", index)
        with self._lock:
            masks = self._event_sets.get(getattr(eventSet, "serial", -1))
            if masks is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            masks[index] = masks.get(index, 0) | eventTypes

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> FakeEventData:
        """Next event, waiting up to ``timeoutms``; ``NVMLError_Timeout`` when none came."""
        self._enter("nvmlEventSetWait")
        serial = getattr(eventSet, "serial", -1)
        with self._events:
            queue = self._queues.get(serial)
            if queue is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if not queue and timeoutms > 0:
                self._events.wait_for(lambda: bool(queue), timeout=timeoutms / 1000)
            if not queue:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            return queue.popleft()

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._enter("nvmlEventSetFree")
        with self._lock:
            serial = getattr(eventSet, "serial", -1)
            if self._event_sets.pop(serial, None) is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._queues.pop(serial, None)


__all__ = [
    "LEGACY_NVLINK_FUNCTIONS",
    "NVML_FUNCTIONS",
    "FakeEventData",
    "FakeEventSet",
    "FakeHandle",
    "FakeNvml",
    "SimGpu",
    "SimLink",
]
