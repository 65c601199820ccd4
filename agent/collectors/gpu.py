"""``gpu`` collector: dcgm-exporter-compatible device metrics and per-GPU health.

Serves the sampler's latest snapshot (never calls NVML). Which DCGM names are
exported is data: every ``DCGM_*`` row of the catalogue whose source is
``gpu``; values come from :data:`stormwatch.agent.gpu.queries.DEVICE_QUERIES`.
A lost GPU shows as ``stormwatch_gpu_up{gpu} 0`` while the others keep
exporting (FC-02).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from stormwatch.agent.catalogue import load_catalogue
from stormwatch.agent.collectors.base import new_family
from stormwatch.agent.errors import CollectorError
from stormwatch.agent.gpu.model import GpuSnapshot
from stormwatch.agent.gpu.sampler import GpuSampler


def latest_snapshot(sampler: GpuSampler) -> GpuSnapshot:
    """The sampler's snapshot; raises :class:`CollectorError` before the first sample."""
    snapshot = sampler.latest
    if snapshot is None:
        raise CollectorError("no GPU sample yet")
    return snapshot


class GpuCollector:
    """Device metrics from :class:`GpuSampler` snapshots.

    Args:
        sampler: the running sampler.
        hostname: value of dcgm-exporter's ``Hostname`` label (the agent's node name).
        clock: Unix time, for the snapshot age.

    Raises (from ``collect``):
        CollectorError: no sample yet, or ``nvmlDeviceGetCount`` failed in the last sample.
    """

    name = "gpu"

    def __init__(
        self, sampler: GpuSampler, *, hostname: str, clock: Callable[[], float] = time.time
    ) -> None:
        self._sampler = sampler
        self._hostname = hostname
        self._clock = clock
        self._dcgm_names = tuple(
            spec.name for spec in load_catalogue().by_source("gpu") if spec.name.startswith("DCGM_")
        )

    def collect(self) -> Iterator[Metric]:
        snapshot = latest_snapshot(self._sampler)
        if snapshot.error is not None:
            raise CollectorError(f"GPU sample failed: {snapshot.error}")
        age = new_family("stormwatch_gpu_snapshot_age_seconds")
        age.add_metric([], max(0.0, self._clock() - snapshot.taken_at))
        duration = new_family("stormwatch_gpu_snapshot_duration_seconds")
        duration.add_metric([], snapshot.duration_seconds)
        count = new_family("stormwatch_gpu_devices")
        count.add_metric([], float(snapshot.device_count or 0))
        up = new_family("stormwatch_gpu_up")
        errors = new_family("stormwatch_gpu_nvml_errors_total")
        for (gpu, call, error), n in sorted(snapshot.nvml_errors.items()):
            errors.add_metric([gpu, call, error], float(n))
        families = {name: new_family(name) for name in self._dcgm_names}
        for device in snapshot.devices:
            up.add_metric([str(device.index)], 1.0 if device.up else 0.0)
            if not device.up:
                continue
            labels = device.dcgm_label_values(self._hostname)
            for name, family in families.items():
                value = device.values.get(name)
                if value is not None:
                    family.add_metric(labels, float(value))
        yield from (age, duration, count, up, errors)
        yield from families.values()


__all__ = ["GpuCollector", "latest_snapshot"]
