"""Field values of the simulated GPUs (``nvmlDeviceGetFieldValues``).

Each supported ``NVML_FI_DEV_*`` id maps to a function of the simulated GPU
(and, for per-link fields, the link): NVLink link count, link state (scope = link),
throughput (scope =
link) and error counters (per-link, scoped and totals), ECC, retired pages,
remapped rows, PCIe replays, memory temperature, violation timers. Every other
id, and the ids in ``SimGpu.unsupported_fields``, answers NOT_SUPPORTED in its
entry, as a real driver does for a field the GPU lacks.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from typing import Any

import pynvml

from stormwatch.agent.gpu.sim.devices import SimGpu, SimLink

#: ctypes' own attribute setter: pynvml's structures wrap it in Python (str
#: encoding), which costs most of a simulated sample.
set_field = ctypes.Structure.__setattr__
#: ... and its getter (the entry's ``value`` union, without pynvml's wrapper).
get_field = ctypes.Structure.__getattribute__

_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT

#: NVLink throughput fields (KiB since "boot"): field id -> raw/data overhead factor.
_THROUGHPUT_FIELDS: dict[int, float] = {
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 1.0,
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 1.0,
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: 1.08,
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: 1.08,
}

#: Device counters (``SimGpu.counters`` keys) by field id.
_COUNTER_FIELDS: dict[int, str] = {
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: "ecc_sbe_vol",
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: "ecc_dbe_vol",
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: "ecc_sbe_agg",
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: "ecc_dbe_agg",
    pynvml.NVML_FI_DEV_RETIRED_SBE: "retired_sbe",
    pynvml.NVML_FI_DEV_RETIRED_DBE: "retired_dbe",
    pynvml.NVML_FI_DEV_RETIRED_PENDING: "retired_pending",
    pynvml.NVML_FI_DEV_REMAPPED_COR: "remapped_cor",
    pynvml.NVML_FI_DEV_REMAPPED_UNC: "remapped_unc",
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE: "remap_failure",
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: "pcie_replay",
}

#: Clock-violation timers (ns): the share of elapsed time each policy held the clocks.
_VIOLATION_SHARE: dict[int, float] = {
    pynvml.NVML_FI_DEV_PERF_POLICY_POWER: 0.02,
    pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: 0.005,
    pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: 0.0,
    pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: 0.0,
    pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: 0.1,
    pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY: 0.0,
}

_ERROR_KINDS = {
    "CRC_FLIT": "crc_flit",
    "CRC_DATA": "crc_data",
    "REPLAY": "replay",
    "RECOVERY": "recovery",
}

#: Per-link legacy error fields (links 0-11): field id -> (counter, link).
_LEGACY_LINK_FIELDS: dict[int, tuple[str, int]] = {
    int(getattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{link}")): (counter, link)
    for kind, counter in _ERROR_KINDS.items()
    for link in range(12)
}
#: NVML-summed totals: field id -> counter.
_TOTAL_FIELDS: dict[int, str] = {
    int(getattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL")): counter
    for kind, counter in _ERROR_KINDS.items()
}
#: Scoped (``scopeId`` = link) error fields: field id -> counter ("crc": flit + data).
_SCOPED_FIELDS: dict[int, str] = {
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: "crc",
}


def _link_errors(link: SimLink, counter: str) -> int:
    if counter == "crc":
        return link.errors.get("crc_flit", 0) + link.errors.get("crc_data", 0)
    return link.errors.get(counter, 0)


def field_values(gpu: SimGpu, field_ids: Sequence[Any], *, elapsed: float, temperature: int) -> Any:
    """``nvmlDeviceGetFieldValues``: a real ``c_nvmlFieldValue_t`` array, one entry per id.

    Args:
        gpu: the device.
        field_ids: field ids, or ``(field id, scope)`` pairs (scope = NVLink link).
        elapsed: seconds the simulation has run (throughput and timers grow with it).
        temperature: the GPU's temperature, degrees C (memory runs 6 degrees hotter).

    Each entry carries its own ``nvmlReturn`` (set last) and a microsecond timestamp.
    """
    values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
    now_us = int(time.time() * 1e6)
    for i, field in enumerate(field_ids):
        field_id, scope = field if isinstance(field, tuple) else (field, 0)
        entry = values[i]
        set_field(entry, "fieldId", field_id)
        set_field(entry, "scopeId", scope)
        set_field(entry, "timestamp", now_us)
        if field_id in _THROUGHPUT_FIELDS:
            _fill_throughput(entry, gpu, field_id, scope, elapsed)
        else:
            _fill_field(entry, gpu, field_id, scope, elapsed, temperature)
    return values


def _fill_throughput(entry: Any, gpu: SimGpu, field_id: int, scope: int, elapsed: float) -> None:
    """One NVLink throughput entry: KiB moved by link ``scope`` since the simulation started."""
    set_field(entry, "nvmlReturn", pynvml.NVML_ERROR_NOT_SUPPORTED)
    if not 0 <= scope < len(gpu.links):
        set_field(entry, "nvmlReturn", pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return
    link = gpu.links[scope]
    if not link.throughput_supported or field_id in gpu.unsupported_fields:
        return
    overhead = _THROUGHPUT_FIELDS[field_id]
    kib = link.kib_per_second * elapsed * overhead if link.active else 0.0
    set_field(entry, "valueType", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG)
    get_field(entry, "value").ullVal = int(kib)
    set_field(entry, "nvmlReturn", pynvml.NVML_SUCCESS)


def _fill_field(
    entry: Any, gpu: SimGpu, field_id: int, scope: int, elapsed: float, temperature: int
) -> None:
    """One entry of a device counter, temperature, violation timer or NVLink error counter."""
    set_field(entry, "nvmlReturn", pynvml.NVML_ERROR_NOT_SUPPORTED)
    if field_id in gpu.unsupported_fields:
        return
    value: float
    if field_id == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
        if not gpu.links:
            return
        set_field(entry, "valueType", _UINT)
        get_field(entry, "value").uiVal = len(gpu.links)
        set_field(entry, "nvmlReturn", pynvml.NVML_SUCCESS)
        return
    if field_id == pynvml.NVML_FI_DEV_NVLINK_GET_STATE:
        if not 0 <= scope < len(gpu.links):
            set_field(entry, "nvmlReturn", pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return
        active = gpu.links[scope].active
        set_field(entry, "valueType", _UINT)
        get_field(entry, "value").uiVal = (
            pynvml.NVML_NVLINK_STATE_ACTIVE if active else pynvml.NVML_NVLINK_STATE_INACTIVE
        )
        set_field(entry, "nvmlReturn", pynvml.NVML_SUCCESS)
        return
    if field_id in _COUNTER_FIELDS:
        value = gpu.counters.get(_COUNTER_FIELDS[field_id], 0)
    elif field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
        value = temperature + 6
    elif field_id in _VIOLATION_SHARE:
        value = elapsed * 1e9 * _VIOLATION_SHARE[field_id]
    elif field_id in _TOTAL_FIELDS:
        if not gpu.links or not any(link.errors_supported for link in gpu.links):
            return
        counter = _TOTAL_FIELDS[field_id]
        value = sum(_link_errors(link, counter) for link in gpu.links if link.errors_supported)
    elif field_id in _LEGACY_LINK_FIELDS or field_id in _SCOPED_FIELDS:
        if field_id in _LEGACY_LINK_FIELDS:
            counter, link_index = _LEGACY_LINK_FIELDS[field_id]
        else:
            counter, link_index = _SCOPED_FIELDS[field_id], scope
        if not 0 <= link_index < len(gpu.links):
            set_field(entry, "nvmlReturn", pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return
        link = gpu.links[link_index]
        legacy = field_id in _LEGACY_LINK_FIELDS
        if not link.errors_supported or (legacy and not link.legacy_error_fields):
            return
        value = _link_errors(link, counter)
    else:
        return
    set_field(entry, "valueType", _ULL)
    get_field(entry, "value").ullVal = int(value)
    set_field(entry, "nvmlReturn", pynvml.NVML_SUCCESS)


__all__ = ["field_values"]
