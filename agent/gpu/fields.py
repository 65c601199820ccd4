"""DCGM metrics read through NVML field values: one ``nvmlDeviceGetFieldValues`` per GPU.

ECC error totals, retired pages, remapped rows, the PCIe replay counter, the
memory temperature and the clock-violation timers are all NVML fields
(``NVML_FI_DEV_*``), so one call reads them all and each entry carries its own
``nvmlReturn``: an entry answering NOT_SUPPORTED (or INVALID_ARGUMENT: a field
this driver does not know) marks only that metric unsupported, never zero.
"""

from __future__ import annotations

import ctypes
import dataclasses
import struct
from typing import Any

import pynvml

from stormwatch.agent.gpu.backend import NvmlApi
from stormwatch.agent.gpu.nvml_errors import (
    CALL_UNSUPPORTED,
    UNSUPPORTED,
    ErrorSink,
    Unsupported,
    check,
    error_code,
    error_name,
)

FIELDS_CALL = "nvmlDeviceGetFieldValues"

#: ctypes' own attribute getter. pynvml's structures wrap it in Python to decode
#: byte strings; field values hold only numbers, and a GPU sample reads
#: hundreds of them.
_get = ctypes.Structure.__getattribute__


@dataclasses.dataclass(frozen=True)
class FieldMetric:
    """One catalogue metric backed by one NVML field.

    Attributes:
        name: DCGM metric name.
        field: ``NVML_FI_DEV_*`` id.
        field_name: the id's pynvml constant name (for reasons and reports).
        scale: multiplier from the NVML unit to the catalogue unit.
    """

    name: str
    field: int
    field_name: str
    scale: float = 1.0


def _field(name: str, constant: str, scale: float = 1.0) -> FieldMetric:
    return FieldMetric(name, int(getattr(pynvml, constant)), constant, scale)


#: Device-level DCGM metrics read as NVML fields (units: see catalogue.csv).
FIELD_METRICS: tuple[FieldMetric, ...] = (
    _field("DCGM_FI_DEV_MEMORY_TEMP", "NVML_FI_DEV_MEMORY_TEMP"),
    _field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "NVML_FI_DEV_PCIE_REPLAY_COUNTER"),
    _field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL"),
    _field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL"),
    _field("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "NVML_FI_DEV_ECC_SBE_AGG_TOTAL"),
    _field("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL"),
    _field("DCGM_FI_DEV_RETIRED_SBE", "NVML_FI_DEV_RETIRED_SBE"),
    _field("DCGM_FI_DEV_RETIRED_DBE", "NVML_FI_DEV_RETIRED_DBE"),
    _field("DCGM_FI_DEV_RETIRED_PENDING", "NVML_FI_DEV_RETIRED_PENDING"),
    _field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "NVML_FI_DEV_REMAPPED_UNC"),
    _field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "NVML_FI_DEV_REMAPPED_COR"),
    _field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "NVML_FI_DEV_REMAPPED_FAILURE"),
    # Clock-violation ("perf policy") timers, in ns like dcgm-exporter's CSV says.
    _field("DCGM_FI_DEV_POWER_VIOLATION", "NVML_FI_DEV_PERF_POLICY_POWER"),
    _field("DCGM_FI_DEV_THERMAL_VIOLATION", "NVML_FI_DEV_PERF_POLICY_THERMAL"),
    _field("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "NVML_FI_DEV_PERF_POLICY_SYNC_BOOST"),
    _field("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT"),
    _field("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION"),
    _field("DCGM_FI_DEV_RELIABILITY_VIOLATION", "NVML_FI_DEV_PERF_POLICY_RELIABILITY"),
)


_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def entry_return(entry: Any) -> int:
    """The ``nvmlReturn`` of one ``c_nvmlFieldValue_t``."""
    return int(_get(entry, "nvmlReturn"))


def field_value(entry: Any) -> float:
    """The value of a ``c_nvmlFieldValue_t`` according to its ``valueType``."""
    member = _MEMBER.get(int(_get(entry, "valueType")), "ullVal")
    return float(getattr(_get(entry, "value"), member))


#: ``c_nvmlFieldValue_t`` as laid out in memory (pynvml's ``_fields_``, native alignment):
#: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, the 8-byte value union.
_ENTRY = struct.Struct("@IIqqII8s")
#: valueType -> the union member's ctypes type as a struct code (as :data:`_MEMBER`).
_DECODE = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: struct.Struct("@d"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: struct.Struct("@I"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: struct.Struct("@L"),
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: struct.Struct("@q"),
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: struct.Struct("@i"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: struct.Struct("@H"),
}
_ULL = struct.Struct("@Q")


def _layout_matches() -> bool:
    """``_ENTRY`` describes this pynvml's structure: the same size, and valueType,
    nvmlReturn and value at the offsets ``_ENTRY`` reads them from (else: entry by entry)."""
    kind = pynvml.c_nvmlFieldValue_t
    try:
        offsets = (kind.valueType.offset, kind.nvmlReturn.offset, kind.value.offset)
    except AttributeError:
        return False
    return _ENTRY.size == ctypes.sizeof(kind) and offsets == (24, 28, 32)


_PACKED = _layout_matches()


def decode_entries(entries: Any) -> list[tuple[int, float]]:
    """``(nvmlReturn, value)`` of each ``c_nvmlFieldValue_t`` an
    ``nvmlDeviceGetFieldValues`` call returned: :func:`entry_return` and
    :func:`field_value` of each (the value is meaningless where the entry failed).

    A ctypes array of the structure is decoded from its memory in one pass
    (~0.2 us an entry against ~0.6 us through ctypes' attributes: a GPU sample reads
    ~160 entries a GPU); anything else, entry by entry.
    """
    if (
        _PACKED
        and isinstance(entries, ctypes.Array)
        and entries._type_ is pynvml.c_nvmlFieldValue_t
    ):
        raw = ctypes.string_at(ctypes.addressof(entries), ctypes.sizeof(entries))
        return [
            (ret, float(_DECODE.get(kind, _ULL).unpack_from(value)[0]))
            for _, _, _, _, kind, ret, value in _ENTRY.iter_unpack(raw)
        ]
    return [(entry_return(entry), field_value(entry)) for entry in entries]


def read_fields(
    api: NvmlApi,
    handle: Any,
    metrics: tuple[FieldMetric, ...],
    sink: ErrorSink,
    *,
    scopes: tuple[int, ...] | None = None,
) -> dict[str, float | Unsupported]:
    """Read ``metrics`` with one ``nvmlDeviceGetFieldValues`` call.

    Args:
        api, handle: NVML and the GPU.
        metrics: the fields to read.
        sink: records failed calls (capability answers are not recorded).
        scopes: ``scopeId`` per metric (default 0: device scope).

    Returns:
        metric name -> value (catalogue unit) or :class:`Unsupported`; a metric
        whose entry failed otherwise is absent (the error is recorded).

    Raises:
        DeviceDown: a device-fatal error (e.g. GPU_IS_LOST), for the call or an entry.
    """
    if not metrics:
        return {}
    ids = [(m.field, 0 if scopes is None else scopes[i]) for i, m in enumerate(metrics)]
    try:
        entries = api.nvmlDeviceGetFieldValues(handle, ids)
    except pynvml.NVMLError as exc:
        code = check(FIELDS_CALL, error_code(exc), sink, expected=CALL_UNSUPPORTED)
        if code in CALL_UNSUPPORTED:
            return {m.name: Unsupported(f"{FIELDS_CALL}: {error_name(code)}") for m in metrics}
        return {}
    out: dict[str, float | Unsupported] = {}
    for metric, (ret, value) in zip(metrics, decode_entries(entries), strict=True):
        if ret == pynvml.NVML_SUCCESS:
            out[metric.name] = value * metric.scale
        elif check(FIELDS_CALL, ret, sink, expected=UNSUPPORTED) in UNSUPPORTED:
            out[metric.name] = Unsupported(f"NVML field {metric.field_name}: {error_name(ret)}")
    return out


__all__ = [
    "FIELDS_CALL",
    "FIELD_METRICS",
    "FieldMetric",
    "decode_entries",
    "entry_return",
    "field_value",
    "read_fields",
]
