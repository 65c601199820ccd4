"""``xid`` collector: XID errors as counters that never reset (FC-03).

``stormwatch_gpu_xid_errors_total{gpu,code}`` counts events; alerts use
``increase()`` over a window so they fire once and resolve by themselves.
``DCGM_FI_DEV_XID_ERRORS`` (dcgm-exporter's "last XID") is kept for
dashboards, but decays to 0 after ``window_seconds`` instead of sticking.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from stormwatch.agent.collectors.base import new_family
from stormwatch.agent.collectors.gpu import latest_snapshot
from stormwatch.agent.gpu.sampler import GpuSampler


class XidCollector:
    """XID metrics from the sampler's latest snapshot.

    Args:
        sampler: the running sampler (listening for XID events).
        hostname: dcgm-exporter ``Hostname`` label.
        window_seconds: how long the last XID stays visible in ``DCGM_FI_DEV_XID_ERRORS``.
        clock: Unix time.
    """

    name = "xid"

    def __init__(
        self,
        sampler: GpuSampler,
        *,
        hostname: str,
        window_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sampler = sampler
        self._hostname = hostname
        self._window = window_seconds
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        snapshot = latest_snapshot(self._sampler)
        now = self._clock()
        counts = new_family("stormwatch_gpu_xid_errors_total")
        for (gpu, code), n in sorted(snapshot.xid_counts.items()):
            counts.add_metric([str(gpu), str(code)], float(n))
        last = new_family("DCGM_FI_DEV_XID_ERRORS")
        for device in snapshot.devices:
            if not device.up:
                continue
            seen = snapshot.last_xid.get(device.index)
            value = seen[0] if seen is not None and now - seen[1] <= self._window else 0
            last.add_metric(device.dcgm_label_values(self._hostname), float(value))
        yield from (counts, last)


__all__ = ["XidCollector"]
