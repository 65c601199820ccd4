"""NVLink peer-to-peer status between the GPUs of a node (``DCGM_EXP_P2P_STATUS``).

``nvmlDeviceGetP2PStatus(gpu, peer, NVML_P2P_CAPS_INDEX_NVLINK)`` for every
ordered pair of GPUs that are up. The status rarely changes, so the sampler
refreshes it every ``SamplerOptions.p2p_interval`` seconds (60 s), not every sample.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from stormwatch.agent.errors import DeviceDown
from stormwatch.agent.gpu.backend import NvmlApi
from stormwatch.agent.gpu.nvml_errors import (
    CALL_UNSUPPORTED,
    ErrorSink,
    check,
    error_code,
)

CALL = "nvmlDeviceGetP2PStatus"

#: NVML P2P status -> ``link_status`` label (dcgm-exporter names the same states).
STATUS_NAMES: dict[int, str] = {
    pynvml.NVML_P2P_STATUS_OK: "ok",
    pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED: "chipset_not_supported",
    pynvml.NVML_P2P_STATUS_GPU_NOT_SUPPORTED: "gpu_not_supported",
    pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED: "topology_not_supported",
    pynvml.NVML_P2P_STATUS_DISABLED_BY_REGKEY: "disabled_by_regkey",
    pynvml.NVML_P2P_STATUS_NOT_SUPPORTED: "not_supported",
    pynvml.NVML_P2P_STATUS_UNKNOWN: "unknown",
}


def status_name(status: int) -> str:
    """``link_status`` label value of an NVML P2P status code."""
    return STATUS_NAMES.get(status, "unknown")


def read_p2p(
    api: NvmlApi, handles: Mapping[int, Any], sink_for: Callable[[int], ErrorSink]
) -> tuple[dict[tuple[int, int], int], set[int]]:
    """NVLink P2P status of every ordered pair of ``handles`` (gpu index -> handle).

    Returns:
        ({(gpu, peer): NVML status}, GPUs for which NVML has no P2P query at all).
        A pair whose query failed otherwise is absent (the error is recorded on ``gpu``).
    """
    status: dict[tuple[int, int], int] = {}
    unsupported: set[int] = set()
    for gpu, handle in handles.items():
        for peer, peer_handle in handles.items():
            if peer == gpu or gpu in unsupported:
                continue
            try:
                status[(gpu, peer)] = int(
                    api.nvmlDeviceGetP2PStatus(
                        handle, peer_handle, pynvml.NVML_P2P_CAPS_INDEX_NVLINK
                    )
                )
            except pynvml.NVMLError as exc:
                code = error_code(exc)
                if code in CALL_UNSUPPORTED:
                    unsupported.add(gpu)
                    continue
                try:
                    check(CALL, code, sink_for(gpu))
                except DeviceDown:  # a lost GPU: the next device sample reports it
                    continue
    return status, unsupported


__all__ = ["CALL", "STATUS_NAMES", "read_p2p", "status_name"]
