"""``trainer`` collector: the ranks' prometheus-client multiprocess files, merged.

A thin wrapper over ``prometheus_client.multiprocess.MultiProcessCollector``.
Dead ranks' ``live*`` gauges are removed by the rank watcher
(``mark_process_dead``), so they disappear here; counters and histograms stay
(FC-01).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector


class TrainerCollector:
    """Merges ``*.db`` files of ``metrics_dir`` (which must exist)."""

    name = "trainer"

    def __init__(self, metrics_dir: Path) -> None:
        self._inner = MultiProcessCollector(None, path=str(metrics_dir))

    def collect(self) -> Iterable[Metric]:
        return self._inner.collect()


__all__ = ["TrainerCollector"]
