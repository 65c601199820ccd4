"""``host`` collector: CPU utilisation and memory of the node (psutil), in base units."""

from __future__ import annotations

from collections.abc import Iterator

import psutil
from prometheus_client.core import Metric

from stormwatch.agent.collectors.base import new_family


class HostCollector:
    """CPU utilisation since the previous scrape (0..1) and memory in bytes."""

    name = "host"

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # prime: the first call has no interval to measure

    def collect(self) -> Iterator[Metric]:
        cpu = new_family("stormwatch_host_cpu_utilization_ratio")
        cpu.add_metric([], psutil.cpu_percent(interval=None) / 100.0)
        memory = psutil.virtual_memory()
        total = new_family("stormwatch_host_memory_total_bytes")
        total.add_metric([], float(memory.total))
        available = new_family("stormwatch_host_memory_available_bytes")
        available.add_metric([], float(memory.available))
        used = new_family("stormwatch_host_memory_used_bytes")
        used.add_metric([], float(memory.total - memory.available))
        yield from (cpu, total, available, used)


__all__ = ["HostCollector"]
