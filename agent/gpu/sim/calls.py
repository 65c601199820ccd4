"""What every simulated NVML call passes first: counted, refused before ``nvmlInit``, failed as injected.

Error injection is per function and per device: any ``NVML_ERROR_*`` code the
installed pynvml knows, on one device or all (and on node-wide calls), for a
number of calls or until cleared. A lost GPU (FC-02) fails every call for it
with ``NVML_ERROR_GPU_IS_LOST``, after the injected errors, as a driver does.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Collection

import pynvml


@dataclasses.dataclass
class _ErrorRule:
    call: str
    code: int
    gpu: int | None
    remaining: int | None


class CallGate:
    """Counts, checks and fails NVML calls.

    Args:
        functions: the NVML function names that can be called (and failed).
        is_lost: whether the device of an index has fallen off the bus.

    Attributes:
        calls: how often each function was called (a test can assert that a
            deprecated API was never used, FC-05).

    Thread-safe.
    """

    def __init__(self, functions: Collection[str], is_lost: Callable[[int], bool]) -> None:
        self._functions = functions
        self._is_lost = is_lost
        self._lock = threading.Lock()
        self._rules: list[_ErrorRule] = []
        self._init_count = 0
        self.calls: collections.Counter[str] = collections.Counter()

    def inject(self, call: str, code: int, *, gpu: int | None, times: int | None) -> None:
        """Make ``call`` raise ``pynvml.NVMLError(code)`` (see ``FakeNvml.inject_error``).

        Raises:
            ValueError: unknown function name or error code (a typo must not
                silently inject nothing).
        """
        if call not in self._functions:
            known = ", ".join(self._functions)
            raise ValueError(f"unknown NVML function {call!r}; known: {known}")
        if code not in pynvml.NVMLError._valClassMapping:
            raise ValueError(f"unknown NVML error code {code}")
        with self._lock:
            self._rules.append(_ErrorRule(call, code, gpu, times))

    def clear(self) -> None:
        """Remove every injected error."""
        with self._lock:
            self._rules.clear()

    def opened(self, delta: int) -> None:
        """``nvmlInit`` (+1) or ``nvmlShutdown`` (-1): NVML answers while the count is above 0."""
        with self._lock:
            self._init_count += delta

    def enter(self, call: str, gpu: int | None = None, *, needs_init: bool = True) -> None:
        """Count ``call`` (for device ``gpu``, or node-wide), then fail it if it must fail.

        Raises:
            pynvml.NVMLError: ``UNINITIALIZED`` before ``nvmlInit``, an injected
                code, or ``GPU_IS_LOST`` for a lost device.
        """
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
            if gpu is not None and self._is_lost(gpu):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)


__all__ = ["CallGate"]
