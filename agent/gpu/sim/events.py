"""NVML event sets of the simulated GPUs: XID critical errors delivered to registered sets (FC-03).

An event set collects, per device, the event types registered for it; an XID
emitted for a device is queued on every set that registered
``nvmlEventTypeXidCriticalError`` for it, and ``nvmlEventSetWait`` pops them in
order (waiting up to its timeout).
"""

from __future__ import annotations

import collections
import threading

import pynvml

from stormwatch.agent.gpu.sim.devices import FakeEventData, FakeEventSet, FakeHandle


def _invalid() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)


class XidEvents:
    """The event sets and their queues. Thread-safe: a waiter wakes when an event arrives."""

    def __init__(self) -> None:
        self._ready = threading.Condition(threading.Lock())
        self._masks: dict[int, dict[int, int]] = {}  # serial -> {gpu: event types}
        self._queues: dict[int, collections.deque[FakeEventData]] = {}
        self._next_serial = 1

    def create(self) -> FakeEventSet:
        """``nvmlEventSetCreate``: a new, empty set."""
        with self._ready:
            serial = self._next_serial
            self._next_serial += 1
            self._masks[serial] = {}
            self._queues[serial] = collections.deque()
        return FakeEventSet(serial)

    def register(self, event_set: object, gpu: int, event_types: int) -> None:
        """``nvmlDeviceRegisterEvents``: deliver ``event_types`` of device ``gpu`` to the set.

        Raises:
            pynvml.NVMLError: ``INVALID_ARGUMENT`` for a set that does not exist.
        """
        with self._ready:
            masks = self._masks.get(getattr(event_set, "serial", -1))
            if masks is None:
                raise _invalid()
            masks[gpu] = masks.get(gpu, 0) | event_types

    def wait(self, event_set: object, timeout_ms: int) -> FakeEventData:
        """``nvmlEventSetWait``: the next event, waiting up to ``timeout_ms``.

        Raises:
            pynvml.NVMLError: ``TIMEOUT`` when none came, ``INVALID_ARGUMENT``
                for a set that does not exist.
        """
        with self._ready:
            queue = self._queues.get(getattr(event_set, "serial", -1))
            if queue is None:
                raise _invalid()
            if not queue and timeout_ms > 0:
                self._ready.wait_for(lambda: bool(queue), timeout=timeout_ms / 1000)
            if not queue:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            return queue.popleft()

    def free(self, event_set: object) -> None:
        """``nvmlEventSetFree``.

        Raises:
            pynvml.NVMLError: ``INVALID_ARGUMENT`` for a set that does not exist (or was freed).
        """
        with self._ready:
            serial = getattr(event_set, "serial", -1)
            if self._masks.pop(serial, None) is None:
                raise _invalid()
            self._queues.pop(serial, None)

    def emit_xid(self, gpu: int, code: int) -> None:
        """Queue one XID critical-error event of device ``gpu`` on every set registered for it."""
        xid = pynvml.nvmlEventTypeXidCriticalError
        with self._ready:
            for serial, masks in self._masks.items():
                if masks.get(gpu, 0) & xid:
                    self._queues[serial].append(FakeEventData(FakeHandle(gpu), xid, code))
            self._ready.notify_all()

    def pending(self) -> int:
        """Events queued and not read yet."""
        with self._ready:
            return sum(len(queue) for queue in self._queues.values())


__all__ = ["XidEvents"]
