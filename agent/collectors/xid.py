"""``xid`` collector: XID errors as counters that never reset (FC-03).

``stormwatch_gpu_xid_errors_total{gpu,code}`` counts events; alerts use
``increase()`` over a window so they fire once and resolve by themselves.
``DCGM_FI_DEV_XID_ERRORS`` (dcgm-exporter's "last XID") is kept for
dashboards, but decays to 0 after ``window_seconds`` instead of sticking;
``DCGM_EXP_XID_ERRORS_COUNT{xid}`` counts each code within that window. A GPU
whose driver cannot deliver XID events (registration NOT_SUPPORTED) gets no
XID series at all (``stormwatch_metric_supported`` 0), never a fake 0.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric

from stormwatch.agent.collectors.base import new_family
from stormwatch.agent.collectors.dcgm_series import DcgmSeries
from stormwatch.agent.collectors.gpu import latest_snapshot
from stormwatch.agent.gpu.sampler import GpuSampler
from stormwatch.agent.kube.podresources import PodAttribution


class XidCollector:
    """XID metrics from the sampler's latest snapshot.

    Args:
        sampler: the running sampler (listening for XID events).
        hostname: dcgm-exporter ``Hostname`` label.
        window_seconds: how long the last XID stays visible in ``DCGM_FI_DEV_XID_ERRORS``.
        clock: Unix time.
        pods: Kubernetes pod attribution (None: off Kubernetes).
    """

    name = "xid"

    def __init__(
        self,
        sampler: GpuSampler,
        *,
        hostname: str,
        window_seconds: float,
        clock: Callable[[], float] = time.time,
        pods: PodAttribution | None = None,
    ) -> None:
        self._sampler = sampler
        self._series = DcgmSeries(hostname, pods)
        self._window = window_seconds
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        snapshot = latest_snapshot(self._sampler)
        now = self._clock()
        counts = new_family("stormwatch_gpu_xid_errors_total")
        for (gpu, code), n in sorted(snapshot.xid_counts.items()):
            counts.add_metric([str(gpu), str(code)], float(n))
        last = new_family("DCGM_FI_DEV_XID_ERRORS")
        windowed = new_family("DCGM_EXP_XID_ERRORS_COUNT")
        recent = collections.Counter(
            (gpu, code) for gpu, code, seen in snapshot.xid_events if now - seen <= self._window
        )
        self._series.refresh()
        for device in snapshot.devices:
            if not device.up or "DCGM_FI_DEV_XID_ERRORS" in device.unsupported:
                continue
            seen = snapshot.last_xid.get(device.index)
            value = seen[0] if seen is not None and now - seen[1] <= self._window else 0
            for series in self._series.of(device):
                last.add_labelled(series.label_dict, value)
                for (gpu, code), n in sorted(recent.items()):
                    if gpu == device.index:
                        windowed.add_metric([*series.labels, str(code)], float(n), series.extra)
        yield from (counts, last, windowed)


__all__ = ["XidCollector"]
