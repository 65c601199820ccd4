"""``nvlink`` collector: per-link state, support, throughput and errors; P2P status (FC-04, FC-05).

"Unsupported" is never exported as "idle": a link whose throughput counters
are NOT_SUPPORTED gets ``stormwatch_nvlink_supported{gpu,link} 0`` and no
throughput series; ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` is only exported for
a GPU with at least one supported link (otherwise ``stormwatch_metric_supported``
says 0). Error counters exist only for active links and only for the counters
NVML supports there.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stormwatch.agent.catalogue import load_catalogue
from stormwatch.agent.collectors.base import LabelSets, new_family
from stormwatch.agent.collectors.dcgm_series import DcgmSeries
from stormwatch.agent.collectors.gpu import latest_snapshot
from stormwatch.agent.gpu.model import DCGM_LABELS
from stormwatch.agent.gpu.nvlink_errors import LINK_COUNTERS
from stormwatch.agent.gpu.p2p import status_name
from stormwatch.agent.gpu.sampler import P2P_STATUS, GpuSampler
from stormwatch.agent.kube.podresources import PodAttribution


class NvlinkCollector:
    """NVLink metrics from the sampler's latest snapshot.

    Args:
        sampler: the running sampler (sampling NVLink).
        hostname: dcgm-exporter ``Hostname`` label.
        pods: Kubernetes pod attribution (None: off Kubernetes).
    """

    name = "nvlink"

    def __init__(
        self, sampler: GpuSampler, *, hostname: str, pods: PodAttribution | None = None
    ) -> None:
        self._sampler = sampler
        self._series = DcgmSeries(hostname, pods)
        self._labels = LabelSets()
        self._dcgm_names = tuple(
            spec.name
            for spec in load_catalogue().by_source("nvlink")
            if spec.name.startswith("DCGM_") and spec.labels == DCGM_LABELS
        )

    def collect(self) -> Iterator[Metric]:
        snapshot = latest_snapshot(self._sampler)
        link_up = new_family("stormwatch_nvlink_link_up")
        supported = new_family("stormwatch_nvlink_supported")
        data = new_family("stormwatch_nvlink_data_bytes_total")
        errors = new_family("stormwatch_nvlink_errors_total")
        families = {name: new_family(name) for name in self._dcgm_names}
        p2p = new_family(P2P_STATUS)
        labels_of = {}
        self._series.refresh()
        for device in snapshot.devices:
            if not device.up or device.nvlink is None:
                continue
            gpu = str(device.index)
            targets = self._series.of(device)
            labels_of[device.index] = targets[0].labels
            for name, family in families.items():
                for series in targets:
                    value = series.value(device, name)
                    if value is not None:
                        self._labels.add_labelled(family, series.label_dict, value)
            if not device.nvlink.present:
                supported.add_metric([gpu, "all"], 0.0)
                continue
            add = self._labels.add
            for link in device.nvlink.links:
                name = str(link.link)
                if link.active is not None:
                    add(link_up, (gpu, name), 1.0 if link.active else 0.0)
                if link.supported is not None:
                    add(supported, (gpu, name), 1.0 if link.supported else 0.0)
                for counter in LINK_COUNTERS:
                    if counter in link.errors:
                        add(errors, (gpu, name, counter), link.errors[counter])
                if not link.supported:
                    continue
                for direction, value in (("tx", link.tx_bytes), ("rx", link.rx_bytes)):
                    if value is not None:
                        add(data, (gpu, name, direction), value)
        for (gpu_index, peer), status in sorted(snapshot.p2p.items()):
            if gpu_index in labels_of and peer in labels_of:
                p2p.add_metric(
                    labels_of[gpu_index] + [str(peer), status_name(status)], float(status)
                )
        yield from (link_up, supported, data, errors)
        yield from families.values()
        yield p2p


__all__ = ["NvlinkCollector"]
