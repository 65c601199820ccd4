"""Classifying ``pynvml.NVMLError``: names for labels, and which errors take a GPU down."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pynvml

from stormwatch.agent.errors import DeviceDown

#: NVML error code -> short name (``GPU_IS_LOST``), from pynvml's ``NVML_ERROR_*`` constants.
ERROR_NAMES: dict[int, str] = {
    getattr(pynvml, name): name.removeprefix("NVML_ERROR_")
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, name), int)
}

#: Errors after which a device's handle is useless: the GPU is reported down
#: (``stormwatch_gpu_up 0``) and its handle is re-acquired on the next sample.
DEVICE_FATAL: frozenset[int] = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_GPU_NOT_FOUND,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)

#: "This device/link/field does not have it": a capability answer, not a failure.
UNSUPPORTED: frozenset[int] = frozenset(
    {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT}
)


#: Answers of a whole NVML *function* meaning "this GPU or driver does not have it"
#: (FUNCTION_NOT_FOUND: the driver predates the function). The metrics it would
#: produce are marked unsupported and the answer is not counted as an error.
CALL_UNSUPPORTED: frozenset[int] = frozenset(
    {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
)


@dataclasses.dataclass(frozen=True)
class Unsupported:
    """A metric this GPU cannot report, and why (exported as ``stormwatch_metric_supported 0``)."""

    reason: str


def error_code(exc: pynvml.NVMLError) -> int:
    """The NVML return code carried by ``exc``."""
    return int(getattr(exc, "value", pynvml.NVML_ERROR_UNKNOWN))


def error_name(code: int) -> str:
    """``GPU_IS_LOST`` for 15; ``CODE_<n>`` for codes this binding does not know."""
    return ERROR_NAMES.get(code, f"CODE_{code}")


#: Records one failed call: ``(function name, NVML error code)``.
ErrorSink = Callable[[str, int], None]


def check(call: str, code: int, sink: ErrorSink, *, expected: frozenset[int] = frozenset()) -> int:
    """Handle NVML return ``code`` of ``call``: record it unless ``expected``, return it.

    Raises:
        DeviceDown: ``code`` is in :data:`DEVICE_FATAL`.
    """
    if code not in expected:
        sink(call, code)
    if code in DEVICE_FATAL:
        raise DeviceDown(f"{call}: {error_name(code)}")
    return code


__all__ = [
    "CALL_UNSUPPORTED",
    "DEVICE_FATAL",
    "ERROR_NAMES",
    "UNSUPPORTED",
    "ErrorSink",
    "Unsupported",
    "check",
    "error_code",
    "error_name",
]
