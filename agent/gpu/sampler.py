"""Background NVML sampling: scrapes read the latest :class:`GpuSnapshot`, never NVML.

One thread calls NVML every ``interval`` seconds. Every call is guarded on its
own: an error costs only the value it would have produced, a device-fatal
error (GPU lost) only that GPU, and a failing ``nvmlDeviceGetCount`` only that
sample (FC-02). Handles are cached and re-acquired after a device-fatal error.
XID events are drained from an NVML event set on every sample and kept as
counters (FC-03).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pynvml
from stormwatch.agent.gpu.backend import NvmlApi
from stormwatch.agent.gpu.model import DeviceReading, GpuSnapshot, ProcessEntry
from stormwatch.agent.gpu.nvlink import sample_nvlink
from stormwatch.agent.gpu.nvml_errors import (
    DeviceDown,
    check,
    error_code,
    error_name,
)
from stormwatch.agent.gpu.queries import DEVICE_QUERIES, MEMORY_TOTAL

log = logging.getLogger(__name__)

#: Upper bound on events drained per sample, so an event storm cannot stall sampling.
_MAX_EVENTS_PER_SAMPLE = 1000


@dataclasses.dataclass(frozen=True)
class SamplerOptions:
    """What to sample besides the core device metrics (each follows a collector switch).

    Attributes:
        interval: seconds between samples.
        nvlink: sample NVLink links (``nvlink`` collector).
        processes: sample compute processes (``gpu_processes`` collector).
        xid: listen for XID events (``xid`` collector).
    """

    interval: float = 1.0
    nvlink: bool = True
    processes: bool = True
    xid: bool = True

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ValueError(f"interval: must be > 0 seconds (got {self.interval})")


@dataclasses.dataclass(frozen=True)
class _Identity:
    handle: Any
    uuid: str
    pci_bus_id: str
    name: str


class GpuSampler:
    """Samples NVML on a background thread.

    Args:
        api: an initialised NVML backend (real ``pynvml`` or :class:`FakeNvml`).
        options: see :class:`SamplerOptions`.
        clock: Unix time (seconds) for ``taken_at`` and XID times.

    Use :meth:`start` / :meth:`stop` (or :meth:`sample` directly, e.g. in tests).
    """

    def __init__(
        self,
        api: NvmlApi,
        options: SamplerOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._options = options or SamplerOptions()
        self._clock = clock
        self._lock = threading.Lock()  # one sample at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._identities: dict[int, _Identity] = {}
        self._registered: set[int] = set()
        self._event_set: Any = None
        self._nvml_errors: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._xid_counts: collections.Counter[tuple[int, int]] = collections.Counter()
        self._last_xid: dict[int, tuple[int, float]] = {}
        self._latest: GpuSnapshot | None = None

    # --------------------------------------------------------------- public
    @property
    def latest(self) -> GpuSnapshot | None:
        """The most recent snapshot (None before the first sample)."""
        return self._latest

    def start(self) -> None:
        """Take one sample now (so the first scrape has data), then sample in the background."""
        if self._thread is not None:
            raise RuntimeError("GpuSampler already started")
        self.sample()
        self._thread = threading.Thread(
            target=self._run, name="stormwatch-gpu-sampler", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (waits up to ``timeout`` s for an NVML call in flight) and free events."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning(
                    "GPU sampler still inside an NVML call after %.1f s; leaving it", timeout
                )
                return
        with self._lock:
            if self._event_set is not None:
                try:
                    self._api.nvmlEventSetFree(self._event_set)
                except pynvml.NVMLError as exc:
                    log.warning("nvmlEventSetFree failed: %s", error_name(error_code(exc)))
                self._event_set = None

    def sample(self) -> GpuSnapshot:
        """Sample every GPU once and publish the snapshot; never raises NVML errors."""
        with self._lock:
            started = time.perf_counter()
            snapshot = self._sample_locked(started)
            self._latest = snapshot
            return snapshot

    # -------------------------------------------------------------- private
    def _run(self) -> None:
        while not self._stop.wait(self._options.interval):
            try:
                self.sample()
            except Exception:  # a bug must not kill sampling; the snapshot age will show it
                log.exception("GPU sample failed")

    def _record(self, gpu: int | None, call: str, code: int) -> None:
        self._nvml_errors[("" if gpu is None else str(gpu), call, error_name(code))] += 1

    def _sink(self, gpu: int) -> Callable[[str, int], None]:
        def sink(call: str, code: int) -> None:
            self._record(gpu, call, code)

        return sink

    def _sample_locked(self, started: float) -> GpuSnapshot:
        error: str | None = None
        count: int | None = None
        devices: tuple[DeviceReading, ...] = ()
        try:
            count = int(self._api.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            self._record(None, "nvmlDeviceGetCount", error_code(exc))
            error = f"nvmlDeviceGetCount: {error_name(error_code(exc))}"
        if count is not None:
            if self._options.xid:
                self._ensure_event_set()
            devices = tuple(self._sample_device(index) for index in range(count))
            if self._options.xid:
                self._drain_events()
        return GpuSnapshot(
            taken_at=self._clock(),
            duration_seconds=time.perf_counter() - started,
            device_count=count,
            devices=devices,
            error=error,
            nvml_errors=MappingProxyType(dict(self._nvml_errors)),
            xid_counts=MappingProxyType(dict(self._xid_counts)),
            last_xid=MappingProxyType(dict(self._last_xid)),
        )

    def _sample_device(self, index: int) -> DeviceReading:
        sink = self._sink(index)
        try:
            ident = self._identity(index, sink)
            values: dict[str, float] = {}
            for query in DEVICE_QUERIES:
                try:
                    values.update(query.read(self._api, ident.handle))
                except pynvml.NVMLError as exc:
                    check(query.call, error_code(exc), sink)
            total = values.pop(MEMORY_TOTAL, None)
            nvlink = sample_nvlink(self._api, ident.handle, sink) if self._options.nvlink else None
            processes = self._processes(ident.handle, sink) if self._options.processes else None
        except DeviceDown as down:
            log.debug("GPU %d down: %s", index, down)
            self._identities.pop(index, None)
            self._registered.discard(index)
            return DeviceReading(index=index, up=False)
        return DeviceReading(
            index=index,
            up=True,
            uuid=ident.uuid,
            pci_bus_id=ident.pci_bus_id,
            name=ident.name,
            values=MappingProxyType(values),
            memory_total_bytes=None if total is None else int(total),
            nvlink=nvlink,
            processes=processes,
        )

    def _identity(self, index: int, sink: Callable[[str, int], None]) -> _Identity:
        cached = self._identities.get(index)
        if cached is not None:
            return cached
        try:
            handle = self._api.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            sink("nvmlDeviceGetHandleByIndex", error_code(exc))
            raise DeviceDown(f"nvmlDeviceGetHandleByIndex: {error_name(error_code(exc))}") from exc

        def text(call: str, read: Callable[[], str]) -> str:
            try:
                return str(read())
            except pynvml.NVMLError as exc:
                check(call, error_code(exc), sink)
                return ""

        ident = _Identity(
            handle=handle,
            uuid=text("nvmlDeviceGetUUID", lambda: self._api.nvmlDeviceGetUUID(handle)),
            pci_bus_id=text(
                "nvmlDeviceGetPciInfo", lambda: self._api.nvmlDeviceGetPciInfo(handle).busId
            ),
            name=text("nvmlDeviceGetName", lambda: self._api.nvmlDeviceGetName(handle)),
        )
        if self._options.xid and self._event_set is not None:
            self._register_events(index, handle, sink)
        # Cache only complete identities, so missing labels are retried next sample.
        if ident.uuid and ident.pci_bus_id and ident.name:
            self._identities[index] = ident
        return ident

    def _processes(
        self, handle: Any, sink: Callable[[str, int], None]
    ) -> tuple[ProcessEntry, ...] | None:
        try:
            raw = self._api.nvmlDeviceGetComputeRunningProcesses(handle)
        except pynvml.NVMLError as exc:
            check("nvmlDeviceGetComputeRunningProcesses", error_code(exc), sink)
            return None
        entries = []
        for proc in raw:
            used = getattr(proc, "usedGpuMemory", None)
            entries.append(
                ProcessEntry(pid=int(proc.pid), used_bytes=None if used is None else int(used))
            )
        return tuple(entries)

    # ------------------------------------------------------------ XID events
    def _ensure_event_set(self) -> None:
        if self._event_set is not None:
            return
        try:
            self._event_set = self._api.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self._record(None, "nvmlEventSetCreate", error_code(exc))
            return
        self._registered.clear()
        for index, ident in list(self._identities.items()):
            self._register_events(index, ident.handle, self._sink(index))

    def _register_events(self, index: int, handle: Any, sink: Callable[[str, int], None]) -> None:
        if index in self._registered:
            return
        try:
            self._api.nvmlDeviceRegisterEvents(
                handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set
            )
        except pynvml.NVMLError as exc:
            check("nvmlDeviceRegisterEvents", error_code(exc), sink)
            return
        self._registered.add(index)

    def _drain_events(self) -> None:
        if self._event_set is None:
            return
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                data = self._api.nvmlEventSetWait(self._event_set, 0)
            except pynvml.NVMLError as exc:
                if error_code(exc) != pynvml.NVML_ERROR_TIMEOUT:  # TIMEOUT: queue empty
                    self._record(None, "nvmlEventSetWait", error_code(exc))
                return
            if not int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                gpu = int(self._api.nvmlDeviceGetIndex(data.device))
            except pynvml.NVMLError as exc:
                self._record(None, "nvmlDeviceGetIndex", error_code(exc))
                gpu = -1
            code = int(data.eventData)
            self._xid_counts[(gpu, code)] += 1
            self._last_xid[gpu] = (code, self._clock())
            log.warning("XID %d on GPU %d", code, gpu)


__all__ = ["GpuSampler", "SamplerOptions"]
