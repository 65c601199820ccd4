"""Background NVML sampling: scrapes read the latest :class:`GpuSnapshot`, never NVML.

One thread calls NVML every ``interval`` seconds. Every call is guarded on its
own: an error costs only the value it would have produced, a device-fatal
error (GPU lost) only that GPU, and a failing ``nvmlDeviceGetCount`` only that
sample (FC-02). Handles are cached and re-acquired after a device-fatal error.
XID events are kept as counters (FC-03): between samples the thread waits on the
NVML event set (``nvmlEventSetWait``, in slices of :data:`EVENT_WAIT_SLICE_S`) rather
than sleeping, and an XID that arrives is sampled and published at once, so it reaches
the next scrape (at most one scrape interval) instead of waiting for the next sample
too; each sample also drains what is queued.

Per GPU one sample reads the function-call metrics (:mod:`.queries`), the
field-value metrics (:mod:`.fields`), the profiling metrics (:mod:`.gpm`) and
NVLink (:mod:`.nvlink`), and the MIG instances of a GPU in MIG mode
(:mod:`.mig`). What NVML answers NOT_SUPPORTED for is recorded as
*unsupported* with its reason, never as a zero.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import pynvml

from stormwatch.agent.errors import DeviceDown
from stormwatch.agent.gpu.backend import NvmlApi
from stormwatch.agent.gpu.fields import FIELD_METRICS, read_fields
from stormwatch.agent.gpu.gpm import GpmReader
from stormwatch.agent.gpu.identity import Identity, read_identity, system_info
from stormwatch.agent.gpu.mig import read_mig
from stormwatch.agent.gpu.model import DeviceReading, GpuSnapshot, ProcessEntry
from stormwatch.agent.gpu.nvlink import sample_nvlink
from stormwatch.agent.gpu.nvml_errors import (
    CALL_UNSUPPORTED,
    Unsupported,
    check,
    error_code,
    error_name,
)
from stormwatch.agent.gpu.p2p import read_p2p
from stormwatch.agent.gpu.queries import (
    CLOCK_EVENT_REASONS,
    CLOCK_REASONS,
    DEVICE_QUERIES,
    MEMORY_TOTAL,
)

log = logging.getLogger(__name__)

#: Longest single ``nvmlEventSetWait`` between samples (s): how soon :meth:`GpuSampler.stop`
#: is heard by a thread waiting for events.
EVENT_WAIT_SLICE_S = 0.5
#: Upper bound on events drained per sample, so an event storm cannot stall sampling.
_MAX_EVENTS_PER_SAMPLE = 1000
#: Recent XID / clock events kept for the windowed ``DCGM_EXP_*_COUNT`` metrics.
_MAX_RECENT_EVENTS = 10_000

XID_METRICS = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT")
CLOCK_EVENTS_COUNT = "DCGM_EXP_CLOCK_EVENTS_COUNT"
HEALTH_STATUS = "DCGM_EXP_GPU_HEALTH_STATUS"
P2P_STATUS = "DCGM_EXP_P2P_STATUS"


@dataclasses.dataclass(frozen=True)
class SamplerOptions:
    """What to sample besides the core device metrics (each follows a collector switch).

    Attributes:
        interval: seconds between samples.
        nvlink: sample NVLink links and P2P status (``nvlink`` collector).
        processes: sample compute processes (``gpu_processes`` collector).
        xid: listen for XID events (``xid`` collector).
        p2p_interval: seconds between P2P status refreshes (60 s: the status only
            changes with the topology or a driver setting).
    """

    interval: float = 1.0
    nvlink: bool = True
    processes: bool = True
    xid: bool = True
    p2p_interval: float = 60.0

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ValueError(f"interval: must be > 0 seconds (got {self.interval})")
        if self.p2p_interval <= 0:
            raise ValueError(f"p2p_interval: must be > 0 seconds (got {self.p2p_interval})")


class GpuSampler:
    """Samples NVML on a background thread.

    Args:
        api: an initialised NVML backend (real ``pynvml`` or :class:`FakeNvml`).
        options: see :class:`SamplerOptions`.
        clock: Unix time (seconds) for ``taken_at`` and event times.

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
        self._system: dict[str, str] | None = None
        self._identities: dict[int, Identity] = {}
        self._gpm: dict[int, GpmReader] = {}
        self._registered: set[int] = set()
        self._xid_unsupported: dict[int, str] = {}
        self._event_set: Any = None
        self._nvml_errors: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._xid_counts: collections.Counter[tuple[int, int]] = collections.Counter()
        self._last_xid: dict[int, tuple[int, float]] = {}
        self._xid_events: collections.deque[tuple[int, int, float]] = collections.deque(
            maxlen=_MAX_RECENT_EVENTS
        )
        self._clock_masks: dict[int, int] = {}
        self._clock_events: collections.deque[tuple[int, str, float]] = collections.deque(
            maxlen=_MAX_RECENT_EVENTS
        )
        self._p2p: dict[tuple[int, int], int] = {}
        self._p2p_unsupported: set[int] = set()
        self._p2p_at: float | None = None
        self._latest: GpuSnapshot | None = None
        self._listeners: list[Callable[[], None]] = []

    # --------------------------------------------------------------- public
    @property
    def latest(self) -> GpuSnapshot | None:
        """The most recent snapshot (None before the first sample)."""
        return self._latest

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (on the sampling thread) after each published snapshot;
        its exceptions are logged, never raised into sampling."""
        self._listeners.append(listener)

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
        """Stop the thread (waits up to ``timeout`` s for an NVML call in flight); free NVML objects."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning(
                    "GPU sampler still inside an NVML call after %.1f s; leaving it", timeout
                )
                return
        with self._lock:
            for reader in self._gpm.values():
                reader.close()
            self._gpm.clear()
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
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.warning("GPU sample listener failed", exc_info=True)
        return snapshot

    # -------------------------------------------------------------- private
    def _run(self) -> None:
        while not self._wait_between_samples():
            try:
                self.sample()
            except Exception:  # a bug must not kill sampling; the snapshot age will show it
                log.exception("GPU sample failed")

    def _wait_between_samples(self) -> bool:
        """Wait one interval, or until an XID event arrives (then sample at once); whether
        the sampler was stopped. Without an event set (XIDs off or unsupported, or its
        wait failing) a plain wait."""
        deadline = time.monotonic() + self._options.interval
        while (remaining := deadline - time.monotonic()) > 0:
            event_set = self._event_set if self._options.xid else None
            if event_set is None:
                return self._stop.wait(remaining)
            if self._stop.is_set():
                return True
            wait_ms = max(1, int(min(remaining, EVENT_WAIT_SLICE_S) * 1000))
            try:
                data = self._api.nvmlEventSetWait(event_set, wait_ms)
            except pynvml.NVMLError as exc:
                if error_code(exc) == pynvml.NVML_ERROR_TIMEOUT:
                    continue
                with self._lock:
                    self._record(None, "nvmlEventSetWait", error_code(exc))
                return self._stop.wait(remaining)
            with self._lock:
                if self._take_event(data):
                    break
        return self._stop.is_set()

    def _record(self, gpu: int | None, call: str, code: int) -> None:
        self._nvml_errors[("" if gpu is None else str(gpu), call, error_name(code))] += 1

    def _sink(self, gpu: int | None) -> Callable[[str, int], None]:
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
            if self._system is None:
                self._system = system_info(self._api, self._sink(None))
            if self._options.xid:
                self._ensure_event_set()
            devices = tuple(self._sample_device(index) for index in range(count))
            if self._options.xid:
                self._drain_events()
            if self._options.nvlink:
                devices = self._with_p2p(devices)
        return GpuSnapshot(
            taken_at=self._clock(),
            duration_seconds=time.perf_counter() - started,
            device_count=count,
            devices=devices,
            error=error,
            nvml_errors=MappingProxyType(dict(self._nvml_errors)),
            xid_counts=MappingProxyType(dict(self._xid_counts)),
            last_xid=MappingProxyType(dict(self._last_xid)),
            xid_events=tuple(self._xid_events),
            clock_events=tuple(self._clock_events),
            p2p=MappingProxyType(dict(self._p2p)),
        )

    def _sample_device(self, index: int) -> DeviceReading:
        sink = self._sink(index)
        values: dict[str, float] = {}
        unsupported: dict[str, str] = {}

        def merge(reading: Mapping[str, float | Unsupported]) -> None:
            for name, value in reading.items():
                if isinstance(value, Unsupported):
                    unsupported[name] = value.reason
                else:
                    values[name] = float(value)

        try:
            ident = self._identity(index, sink)
            handle = ident.handle
            for query in DEVICE_QUERIES:
                try:
                    merge(query.read(self._api, handle))
                except pynvml.NVMLError as exc:
                    code = check(query.call, error_code(exc), sink, expected=CALL_UNSUPPORTED)
                    if code in CALL_UNSUPPORTED:
                        reason = Unsupported(f"{query.call}: {error_name(code)}")
                        merge(dict.fromkeys(query.metrics, reason))
            merge(read_fields(self._api, handle, FIELD_METRICS, sink))
            merge(self._gpm_reader(index, handle).read(sink))
            nvlink = sample_nvlink(self._api, handle, sink) if self._options.nvlink else None
            if nvlink is not None:
                merge(nvlink.dcgm)
            processes = self._processes(handle, sink) if self._options.processes else None
            total = values.pop(MEMORY_TOTAL, None)
            mig = read_mig(
                self._api, handle, sink, device_memory_bytes=None if total is None else int(total)
            )
        except DeviceDown as down:
            # Reported, not swallowed: the error was counted by ``sink`` and the GPU is
            # exported down (stormwatch_gpu_up 0) until a sample reaches it again.
            log.debug("GPU %d down: %s", index, down)
            self._forget(index)
            return DeviceReading(index=index, up=False)
        supported = set(values) | {HEALTH_STATUS}
        self._clock_event_support(index, values, unsupported, supported)
        if self._options.xid:
            if index in self._registered:
                supported.update(XID_METRICS)
            elif index in self._xid_unsupported:
                unsupported.update(dict.fromkeys(XID_METRICS, self._xid_unsupported[index]))
        return DeviceReading(
            index=index,
            up=True,
            uuid=ident.uuid,
            pci_bus_id=ident.pci_bus_id,
            name=ident.name,
            values=MappingProxyType(values),
            unsupported=MappingProxyType(unsupported),
            supported=frozenset(supported),
            info=ident.info,
            memory_total_bytes=None if total is None else int(total),
            nvlink=nvlink,
            processes=processes,
            mig=mig,
        )

    def _clock_event_support(
        self, index: int, values: dict[str, float], unsupported: dict[str, str], supported: set[str]
    ) -> None:
        """Track clock-event onsets (for ``DCGM_EXP_CLOCK_EVENTS_COUNT``) from the reasons mask."""
        if CLOCK_REASONS in unsupported:
            unsupported[CLOCK_EVENTS_COUNT] = unsupported[CLOCK_REASONS]
            return
        if CLOCK_REASONS not in values:
            return
        supported.add(CLOCK_EVENTS_COUNT)
        mask = int(values[CLOCK_REASONS])
        previous = self._clock_masks.get(index, 0)
        self._clock_masks[index] = mask
        now = self._clock()
        for bit, reason in CLOCK_EVENT_REASONS:
            if mask & bit and not previous & bit:
                self._clock_events.append((index, reason, now))

    def _forget(self, index: int) -> None:
        """Drop a lost GPU's cached handle and NVML objects (re-acquired when it returns)."""
        self._identities.pop(index, None)
        self._registered.discard(index)
        reader = self._gpm.pop(index, None)
        if reader is not None:
            reader.close()

    def _identity(self, index: int, sink: Callable[[str, int], None]) -> Identity:
        cached = self._identities.get(index)
        if cached is not None:
            return cached
        try:
            handle = self._api.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            sink("nvmlDeviceGetHandleByIndex", error_code(exc))
            raise DeviceDown(f"nvmlDeviceGetHandleByIndex: {error_name(error_code(exc))}") from exc
        ident = read_identity(self._api, handle, sink, self._system or {})
        if self._options.xid and self._event_set is not None:
            self._register_events(index, handle, sink)
        # Cache only complete identities, so missing labels are retried next sample.
        if ident.complete:
            self._identities[index] = ident
        return ident

    def _gpm_reader(self, index: int, handle: Any) -> GpmReader:
        reader = self._gpm.get(index)
        if reader is None:
            reader = self._gpm[index] = GpmReader(self._api, handle)
        return reader

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

    def _with_p2p(self, devices: tuple[DeviceReading, ...]) -> tuple[DeviceReading, ...]:
        """Refresh the NVLink P2P matrix when due; mark each GPU's P2P support."""
        up = {d.index for d in devices if d.up}
        now = self._clock()
        if self._p2p_at is None or now - self._p2p_at >= self._options.p2p_interval:
            handles = {i: self._identities[i].handle for i in sorted(up) if i in self._identities}
            self._p2p, self._p2p_unsupported = read_p2p(self._api, handles, self._sink)
            self._p2p_at = now
        out = []
        for device in devices:
            if not device.up or len(up) < 2:
                out.append(device)
            elif device.index in self._p2p_unsupported:
                reason = {P2P_STATUS: "nvmlDeviceGetP2PStatus: NOT_SUPPORTED"}
                out.append(
                    dataclasses.replace(
                        device, unsupported=MappingProxyType({**device.unsupported, **reason})
                    )
                )
            elif any(gpu == device.index and peer in up for gpu, peer in self._p2p):
                out.append(dataclasses.replace(device, supported=device.supported | {P2P_STATUS}))
            else:
                out.append(device)
        return tuple(out)

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
        call = "nvmlDeviceRegisterEvents"
        self._xid_unsupported.pop(index, None)
        try:
            self._api.nvmlDeviceRegisterEvents(
                handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set
            )
        except pynvml.NVMLError as exc:
            code = check(call, error_code(exc), sink, expected=CALL_UNSUPPORTED)
            if code in CALL_UNSUPPORTED:
                self._xid_unsupported[index] = f"{call}: {error_name(code)} (XIDs cannot be seen)"
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
            self._take_event(data)

    def _take_event(self, data: Any) -> bool:
        """Count one event of the set if it is an XID (whether it was). Under the lock."""
        if not int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
            return False
        try:
            gpu = int(self._api.nvmlDeviceGetIndex(data.device))
        except pynvml.NVMLError as exc:
            self._record(None, "nvmlDeviceGetIndex", error_code(exc))
            gpu = -1
        code = int(data.eventData)
        now = self._clock()
        self._xid_counts[(gpu, code)] += 1
        self._last_xid[gpu] = (code, now)
        self._xid_events.append((gpu, code, now))
        log.warning("XID %d on GPU %d", code, gpu)
        return True


__all__ = [
    "CLOCK_EVENTS_COUNT",
    "EVENT_WAIT_SLICE_S",
    "HEALTH_STATUS",
    "P2P_STATUS",
    "XID_METRICS",
    "GpuSampler",
    "SamplerOptions",
]
