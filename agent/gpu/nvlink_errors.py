"""NVLink error counters through field values, for active links only (FC-04, FC-05).

Per link (``stormwatch_nvlink_errors_total{gpu,link,counter}``):

* ``crc_flit``, ``crc_data``: ``NVML_FI_DEV_NVLINK_CRC_{FLIT,DATA}_ERROR_COUNT_L<n>``;
  NVML has these per-link fields for links 0-11 only (pre-Hopper naming);
* ``replay``, ``recovery``, ``crc``: ``NVML_FI_DEV_NVLINK_ERROR_DL_{REPLAY,RECOVERY,CRC}``
  with ``scopeId`` = link (any link; Hopper reports CRC errors here, not split into flit/data).

Per GPU (dcgm-exporter's names): ``DCGM_FI_DEV_NVLINK_{CRC_FLIT,CRC_DATA,REPLAY,RECOVERY}
_ERROR_COUNT_TOTAL`` from NVML's own ``..._TOTAL`` fields (NVML sums every link).
Each entry's ``nvmlReturn`` is checked on its own: NOT_SUPPORTED leaves that
counter out (and marks a total unsupported); nothing is ever reset.
"""

from __future__ import annotations

import functools
from typing import Any

import pynvml

from stormwatch.agent.gpu.backend import NvmlApi
from stormwatch.agent.gpu.fields import FieldMetric, read_fields
from stormwatch.agent.gpu.nvml_errors import ErrorSink, Unsupported

#: Links 0-11 have per-link legacy field ids.
LEGACY_LINKS = 12

_LEGACY_COUNTERS = {"crc_flit": "CRC_FLIT", "crc_data": "CRC_DATA"}
_SCOPED_COUNTERS = {
    "replay": "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
    "recovery": "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY",
    "crc": "NVML_FI_DEV_NVLINK_ERROR_DL_CRC",
}

#: Per-link counter names, in exposition order.
LINK_COUNTERS: tuple[str, ...] = ("crc_flit", "crc_data", "replay", "recovery", "crc")

#: dcgm-exporter's NVLink error totals and their NVML ``_TOTAL`` fields.
TOTAL_METRICS: tuple[FieldMetric, ...] = tuple(
    FieldMetric(
        f"DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL",
        int(getattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL")),
        f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL",
    )
    for kind in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY")
)


@functools.cache
def _legacy(counter: str, link: int) -> FieldMetric:
    constant = f"NVML_FI_DEV_NVLINK_{_LEGACY_COUNTERS[counter]}_ERROR_COUNT_L{link}"
    return FieldMetric(f"{counter}:{link}", int(getattr(pynvml, constant)), constant)


@functools.cache
def _scoped(counter: str, link: int) -> FieldMetric:
    constant = _SCOPED_COUNTERS[counter]
    return FieldMetric(f"{counter}:{link}", int(getattr(pynvml, constant)), constant)


@functools.lru_cache(maxsize=64)
def _plan(
    active: tuple[int, ...],
) -> tuple[tuple[FieldMetric, ...], tuple[int, ...], tuple[tuple[int, str] | None, ...]]:
    """The fields to read for these active links, their scopes, and where each value goes
    (``(link, counter)``, None for a DCGM total): the same for every sample while the
    same links are up, so built once (a GPU's 18 links: 90 fields)."""
    metrics: list[FieldMetric] = list(TOTAL_METRICS)
    scopes: list[int] = [0] * len(TOTAL_METRICS)
    targets: list[tuple[int, str] | None] = [None] * len(TOTAL_METRICS)
    for link in active:
        if link < LEGACY_LINKS:
            for counter in _LEGACY_COUNTERS:
                metrics.append(_legacy(counter, link))
                scopes.append(0)
                targets.append((link, counter))
        for counter in _SCOPED_COUNTERS:
            metrics.append(_scoped(counter, link))
            scopes.append(link)
            targets.append((link, counter))
    return tuple(metrics), tuple(scopes), tuple(targets)


def read_link_errors(
    api: NvmlApi, handle: Any, active: list[int], sink: ErrorSink
) -> tuple[dict[int, dict[str, float]], dict[str, float | Unsupported]]:
    """Error counters of the ``active`` links and the GPU's DCGM totals (one NVML call).

    Returns:
        (per link: {counter: value} with supported counters only,
         DCGM total name -> value or :class:`Unsupported`).

    Raises:
        DeviceDown: a device-fatal NVML error.
    """
    metrics, scopes, targets = _plan(tuple(active))
    values = read_fields(api, handle, metrics, sink, scopes=scopes)
    per_link: dict[int, dict[str, float]] = {link: {} for link in active}
    totals: dict[str, float | Unsupported] = {}
    for metric, target in zip(metrics, targets, strict=True):
        value = values.get(metric.name)
        if value is None:
            continue  # the entry failed (recorded by read_fields)
        if target is None:
            totals[metric.name] = value
        elif not isinstance(value, Unsupported):
            per_link[target[0]][target[1]] = value
    return per_link, totals


__all__ = ["LEGACY_LINKS", "LINK_COUNTERS", "TOTAL_METRICS", "read_link_errors"]
