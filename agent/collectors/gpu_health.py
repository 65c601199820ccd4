"""``DCGM_EXP_GPU_HEALTH_STATUS`` from NVML readings, by stormwatch's own rules.

dcgm-exporter takes this from DCGM's health watches (nv-hostengine); NVML has
no such service, so the agent derives a per-watch verdict from what it
samples anyway. Values follow DCGM: 0 pass, 10 warn, 20 fail. A watch is only
reported when its inputs were read in this sample.

======== ==================================================================
watch    rule
======== ==================================================================
MEM      fail: a row remap failed, or a volatile double-bit ECC error;
         warn: a page waits for retirement, or rows were remapped for
         uncorrectable errors
THERMAL  warn: a hardware or software thermal slowdown holds the clocks
POWER    warn: the hardware power brake holds the clocks
XID      fail: XID 48 (DBE), 63/64 (remap), 74 (NVLink), 79 (off the bus),
         94/95 (ECC containment) within the window; warn: any other XID
======== ==================================================================
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import pynvml

from stormwatch.agent.gpu.queries import CLOCK_REASONS

PASS, WARN, FAIL = 0, 10, 20

#: XIDs that mean the GPU (or its memory or links) needs attention now.
FATAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 94, 95})

_THERMAL = int(
    pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonSwThermalSlowdown
)
_POWER_BRAKE = int(pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown)


def _memory(values: Mapping[str, float]) -> int | None:
    keys = (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    )
    if not any(key in values for key in keys):
        return None
    if (
        values.get("DCGM_FI_DEV_ROW_REMAP_FAILURE", 0) > 0
        or values.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0) > 0
    ):
        return FAIL
    if (
        values.get("DCGM_FI_DEV_RETIRED_PENDING", 0) > 0
        or values.get("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 0) > 0
    ):
        return WARN
    return PASS


def health(values: Mapping[str, float], recent_xids: Collection[int] | None) -> dict[str, int]:
    """Verdict per watch for one GPU.

    Args:
        values: the GPU's DCGM values of this sample.
        recent_xids: XID codes seen on this GPU within the window; None when
            XIDs are not watched (no XID verdict then).
    """
    out: dict[str, int] = {}
    memory = _memory(values)
    if memory is not None:
        out["MEM"] = memory
    if CLOCK_REASONS in values:
        mask = int(values[CLOCK_REASONS])
        out["THERMAL"] = WARN if mask & _THERMAL else PASS
        out["POWER"] = WARN if mask & _POWER_BRAKE else PASS
    if recent_xids is not None:
        if any(code in FATAL_XIDS for code in recent_xids):
            out["XID"] = FAIL
        else:
            out["XID"] = WARN if recent_xids else PASS
    return out


__all__ = ["FAIL", "FATAL_XIDS", "PASS", "WARN", "health"]
