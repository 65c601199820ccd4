"""MIG instances of a GPU in MIG mode: the per-instance readings behind dcgm-exporter's MIG series.

dcgm-exporter exports a GPU in MIG mode per GPU instance, with ``GPU_I_ID`` and
``GPU_I_PROFILE`` labels. NVML reaches an instance through its *MIG device*
handle: ``nvmlDeviceGetMigMode`` (is MIG on), ``nvmlDeviceGetMaxMigDeviceCount``
(how many slots), ``nvmlDeviceGetMigDeviceHandleByIndex`` (NOT_FOUND: an empty
slot), then per MIG device ``nvmlDeviceGetGpuInstanceId``, ``nvmlDeviceGetUUID``
(``MIG-...``, what the kubelet lists) and ``nvmlDeviceGetAttributes`` (slices and
memory, for the profile name). The instance-scoped metrics (:data:`MIG_QUERIES`:
the framebuffer) are read on the MIG device handle; a metric NVML answers
NOT_SUPPORTED for on an instance is left out of its values, so its series is
absent, never 0.

Only :class:`~stormwatch.agent.gpu.fake.FakeNvml` has answered these calls so far;
no real MIG GPU has been sampled.
"""

from __future__ import annotations

import math
from typing import Any

import pynvml

from stormwatch.agent.gpu.backend import NvmlApi
from stormwatch.agent.gpu.model import MigReading
from stormwatch.agent.gpu.nvml_errors import (
    CALL_UNSUPPORTED,
    UNSUPPORTED,
    ErrorSink,
    Unsupported,
    check,
    error_code,
)
from stormwatch.agent.gpu.queries import DEVICE_QUERIES, MEMORY_TOTAL, DeviceQuery

#: Queries read on each MIG device handle (its own framebuffer). The whole-GPU
#: readings (temperature, power, clocks, errors) stay the parent's.
MIG_QUERIES: tuple[DeviceQuery, ...] = tuple(
    q for q in DEVICE_QUERIES if q.call == "nvmlDeviceGetMemoryInfo"
)

_GIB = 1024**3
_MIB = 1024**2
#: MIG memory is allotted in eighths of the GPU's memory (go-nvlib's ``maxMemorySlices``).
_MEMORY_SLICES = 8


def profile_name(
    gi_slices: int, ci_slices: int, memory_mb: int, device_memory_bytes: int | None
) -> str:
    """The MIG profile name as NVIDIA's tools write it: ``1g.10gb``, or ``1c.2g.20gb``.

    Args:
        gi_slices, ci_slices: GPU / compute instance slice counts
            (``c_nvmlDeviceAttributes.gpuInstanceSliceCount`` / ``computeInstanceSliceCount``).
        memory_mb: the instance's memory, MiB (``memorySizeMB``).
        device_memory_bytes: the whole GPU's framebuffer, bytes; None when unknown
            (then the instance memory is rounded up to whole GiB).

    The memory figure follows go-nvlib (the naming behind the k8s device plugin's
    ``nvidia.com/mig-<profile>`` resources): the instance's share of the GPU rounded
    up to eighths, times the GPU's memory in whole GiB rounded up (an H100 80GB's
    9856 MiB instance is ``10gb``, its 80880 MiB one ``80gb``). Media-extension
    suffixes (``+me``) need the GPU-instance profile id and are not written.
    """
    if device_memory_bytes:
        share = math.ceil(memory_mb * _MIB / device_memory_bytes * _MEMORY_SLICES)
        # half away from zero, as Go's math.Round (Python's round() is half to even: an
        # H200's 4/8 of 141 GiB would read 70, where NVIDIA's tools say 3g.71gb)
        gigabytes = math.floor(share / _MEMORY_SLICES * math.ceil(device_memory_bytes / _GIB) + 0.5)
    else:
        gigabytes = math.ceil(memory_mb * _MIB / _GIB)
    prefix = f"{ci_slices}c." if ci_slices and ci_slices != gi_slices else ""
    return f"{prefix}{gi_slices}g.{gigabytes}gb"


def read_mig(
    api: NvmlApi, handle: Any, sink: ErrorSink, *, device_memory_bytes: int | None
) -> tuple[MigReading, ...]:
    """The MIG instances of the GPU ``handle``, in slot order.

    Args:
        api, handle: NVML and the (parent) GPU.
        sink: records failed calls (NOT_SUPPORTED answers are capability answers, not
            recorded).
        device_memory_bytes: the GPU's framebuffer (for the profile names), None when unknown.

    Returns:
        ``()`` when MIG is off, not supported by the GPU or driver, or the instances
        could not be listed; otherwise one reading per populated slot whose identity
        NVML gave (an instance whose id or UUID failed is left out, its error recorded).

    Raises:
        DeviceDown: a device-fatal error (GPU lost) on any of these calls.
    """
    try:
        current, _pending = api.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as exc:
        check("nvmlDeviceGetMigMode", error_code(exc), sink, expected=CALL_UNSUPPORTED)
        return ()
    if int(current) != pynvml.NVML_DEVICE_MIG_ENABLE:
        return ()
    try:
        slots = int(api.nvmlDeviceGetMaxMigDeviceCount(handle))
    except pynvml.NVMLError as exc:
        check("nvmlDeviceGetMaxMigDeviceCount", error_code(exc), sink)
        return ()
    out = []
    for slot in range(slots):
        call = "nvmlDeviceGetMigDeviceHandleByIndex"
        try:
            mig = api.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError as exc:  # NOT_FOUND: nothing in this slot
            check(call, error_code(exc), sink, expected=frozenset({pynvml.NVML_ERROR_NOT_FOUND}))
            continue
        reading = _instance(api, mig, sink, device_memory_bytes)
        if reading is not None:
            out.append(reading)
    return tuple(out)


def _instance(
    api: NvmlApi, mig: Any, sink: ErrorSink, device_memory_bytes: int | None
) -> MigReading | None:
    call = "nvmlDeviceGetGpuInstanceId"
    try:
        gpu_instance_id = int(api.nvmlDeviceGetGpuInstanceId(mig))
        call = "nvmlDeviceGetUUID"
        uuid = api.nvmlDeviceGetUUID(mig)
    except pynvml.NVMLError as exc:
        check(call, error_code(exc), sink)
        return None
    if isinstance(uuid, bytes):
        uuid = uuid.decode()
    profile = ""
    try:
        attributes = api.nvmlDeviceGetAttributes(mig)
    except pynvml.NVMLError as exc:
        check("nvmlDeviceGetAttributes", error_code(exc), sink, expected=CALL_UNSUPPORTED)
    else:
        profile = profile_name(
            int(attributes.gpuInstanceSliceCount),
            int(attributes.computeInstanceSliceCount),
            int(attributes.memorySizeMB),
            device_memory_bytes,
        )
    values: dict[str, float] = {}
    for query in MIG_QUERIES:
        try:
            reading = query.read(api, mig)
        except pynvml.NVMLError as exc:  # NOT_SUPPORTED / INVALID_ARGUMENT: absent
            check(query.call, error_code(exc), sink, expected=CALL_UNSUPPORTED | UNSUPPORTED)
            continue
        for name, value in reading.items():
            if name != MEMORY_TOTAL and not isinstance(value, Unsupported):
                values[name] = float(value)
    return MigReading(
        gpu_instance_id=gpu_instance_id, profile=profile, uuid=str(uuid), values=values
    )


__all__ = ["MIG_QUERIES", "profile_name", "read_mig"]
