"""``gpu`` collector: dcgm-exporter-compatible device metrics and per-GPU health.

Serves the sampler's latest snapshot (never calls NVML). Which DCGM names are
exported is data: every ``DCGM_*`` row of the catalogue whose source is
``gpu`` and whose labels are dcgm-exporter's six; values come from the
sampler's tables (:mod:`stormwatch.agent.gpu.queries`, ``.fields``, ``.gpm``).
A lost GPU shows as ``stormwatch_gpu_up{gpu} 0`` while the others keep
exporting (FC-02). What a GPU cannot report is ``stormwatch_metric_supported
{gpu,metric} 0``, never a zero value.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric

from stormwatch.agent.catalogue import load_catalogue
from stormwatch.agent.collectors.base import Family, LabelSets, new_family
from stormwatch.agent.collectors.dcgm_series import DcgmSeries
from stormwatch.agent.collectors.gpu_health import health
from stormwatch.agent.errors import CollectorError
from stormwatch.agent.gpu.identity import INFO_FIELDS
from stormwatch.agent.gpu.model import DCGM_LABELS, DeviceReading, GpuSnapshot
from stormwatch.agent.gpu.queries import CLOCK_EVENT_REASONS, CLOCK_REASONS
from stormwatch.agent.gpu.sampler import CLOCK_EVENTS_COUNT, HEALTH_STATUS, GpuSampler
from stormwatch.agent.kube.podresources import PodAttribution


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
        clock: Unix time, for the snapshot age and the event windows.
        events_window_seconds: window of ``DCGM_EXP_CLOCK_EVENTS_COUNT`` (300 s,
            dcgm-exporter's ``--clock-events-count-window-size`` default).
        xid_window_seconds: how far back an XID counts for the XID health watch;
            None when XIDs are not watched (``xid`` collector off).
        export_age: export ``stormwatch_gpu_snapshot_age_seconds`` (False when the
            agent renders it per scrape, :class:`~stormwatch.agent.exposition.LiveAges`).
        pods: Kubernetes pod attribution (None: off Kubernetes). With it, every GPU
            (or MIG instance) says whether a pod holds it in
            ``stormwatch_gpu_pod_attributed``, and the kubelet's answer is
            ``stormwatch_kubelet_pod_resources_up``.

    Raises (from ``collect``):
        CollectorError: no sample yet, or ``nvmlDeviceGetCount`` failed in the last sample.
    """

    name = "gpu"

    def __init__(
        self,
        sampler: GpuSampler,
        *,
        hostname: str,
        clock: Callable[[], float] = time.time,
        events_window_seconds: float = 300.0,
        xid_window_seconds: float | None = 300.0,
        export_age: bool = True,
        pods: PodAttribution | None = None,
    ) -> None:
        self._sampler = sampler
        self._export_age = export_age
        self._hostname = hostname
        self._series = DcgmSeries(hostname, pods)
        self._labels = LabelSets()
        self._clock = clock
        self._events_window = events_window_seconds
        self._xid_window = xid_window_seconds
        catalogue = load_catalogue()
        self._dcgm_names = tuple(
            spec.name
            for spec in catalogue.by_source("gpu")
            if spec.name.startswith("DCGM_") and spec.labels == DCGM_LABELS
        )
        self._catalogued = frozenset(spec.name for spec in catalogue)

    def collect(self) -> Iterator[Metric]:
        snapshot = latest_snapshot(self._sampler)
        if snapshot.error is not None:
            raise CollectorError(f"GPU sample failed: {snapshot.error}")
        now = self._clock()
        age = new_family("stormwatch_gpu_snapshot_age_seconds")
        age.add_metric([], max(0.0, now - snapshot.taken_at))
        duration = new_family("stormwatch_gpu_snapshot_duration_seconds")
        duration.add_metric([], snapshot.duration_seconds)
        count = new_family("stormwatch_gpu_devices")
        count.add_metric([], float(snapshot.device_count or 0))
        up = new_family("stormwatch_gpu_up")
        errors = new_family("stormwatch_gpu_nvml_errors_total")
        for (gpu, call, error), n in sorted(snapshot.nvml_errors.items()):
            errors.add_metric([gpu, call, error], float(n))
        families = {name: new_family(name) for name in self._dcgm_names}
        supported = new_family("stormwatch_metric_supported")
        info = new_family("stormwatch_gpu_info")
        active = new_family("stormwatch_gpu_clocks_event_active")
        events = new_family(CLOCK_EVENTS_COUNT)
        status = new_family(HEALTH_STATUS)
        clock_counts = self._window_counts(snapshot.clock_events, now, self._events_window)
        xids = self._recent_xids(snapshot, now)
        pods = self._series.pods
        self._series.refresh()
        attributed = new_family("stormwatch_gpu_pod_attributed")
        pods_up = new_family("stormwatch_kubelet_pod_resources_up")
        for device in snapshot.devices:
            up.add_metric([str(device.index)], 1.0 if device.up else 0.0)
            if not device.up:
                continue
            gpu = str(device.index)
            targets = self._series.of(device)
            labels = targets[0].labels
            for name, family in families.items():
                for series in targets:
                    value = series.value(device, name)
                    if value is not None:
                        self._labels.add_labelled(family, series.label_dict, value)
            if pods is not None:
                for series in targets:
                    instance = "" if series.mig is None else str(series.mig.gpu_instance_id)
                    attributed.add_metric([gpu, instance], 0.0 if series.pod is None else 1.0)
            self._support(supported, device)
            info.add_metric(labels + [device.info.get(field, "") for field in INFO_FIELDS[1:]], 1.0)
            if CLOCK_REASONS in device.values:
                mask = int(device.values[CLOCK_REASONS])
                for bit, reason in CLOCK_EVENT_REASONS:
                    active.add_metric([gpu, reason], 1.0 if mask & bit else 0.0)
                    events.add_metric(
                        [*labels, reason], float(clock_counts.get((device.index, reason), 0))
                    )
            recent = None if xids is None else xids.get(device.index, set())
            for watch, verdict in sorted(health(device.values, recent).items()):
                status.add_metric([*labels, watch], float(verdict))
        if self._export_age:
            yield age
        yield from (duration, count, up, errors)
        yield from families.values()
        yield from (events, status, info, supported, active)
        if pods is not None:
            pods_up.add_metric([], 1.0 if pods.up else 0.0)
            yield from (pods_up, attributed)

    def _support(self, family: Family, device: DeviceReading) -> None:
        """Only the unsupported metrics: a series per supported one would double the scrape."""
        gpu = str(device.index)
        for name in sorted(device.unsupported):
            if name in self._catalogued:
                family.add_metric([gpu, name], 0.0)

    def _recent_xids(self, snapshot: GpuSnapshot, now: float) -> dict[int, set[int]] | None:
        if self._xid_window is None:
            return None
        recent: dict[int, set[int]] = collections.defaultdict(set)
        for gpu, code, seen in snapshot.xid_events:
            if now - seen <= self._xid_window:
                recent[gpu].add(code)
        return recent

    @staticmethod
    def _window_counts(
        events: tuple[tuple[int, str, float], ...], now: float, window: float
    ) -> collections.Counter[tuple[int, str]]:
        return collections.Counter(
            (gpu, reason) for gpu, reason, seen in events if now - seen <= window
        )


__all__ = ["GpuCollector", "latest_snapshot"]
