"""``trainer`` collector: the ranks' prometheus-client multiprocess files, merged.

A thin wrapper over ``prometheus_client.multiprocess.MultiProcessCollector``.
Dead ranks' ``live*`` gauges are removed by the rank watcher
(``mark_process_dead``), so they disappear here; counters and histograms stay
(FC-01).

A sample whose labels cannot be encoded as UTF-8 (a job name with lone surrogates, from a
rank's environment that was not UTF-8) is left out and counted
(:attr:`TrainerCollector.unencodable`, one warning each time more are seen); the text
exposition would otherwise fail, and with it every job's metrics on the node.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

log = logging.getLogger(__name__)


class TrainerCollector:
    """Merges ``*.db`` files of ``metrics_dir`` (which must exist)."""

    name = "trainer"

    def __init__(self, metrics_dir: Path) -> None:
        self._inner = MultiProcessCollector(None, path=str(metrics_dir))
        #: Samples left out so far because their labels cannot be encoded as UTF-8.
        self.unencodable = 0

    def collect(self) -> Iterable[Metric]:
        families = list(self._inner.collect())
        dropped = 0
        for family in families:
            kept = [s for s in family.samples if _encodable(s.labels)]
            dropped += len(family.samples) - len(kept)
            family.samples = kept
        if dropped:
            self.unencodable += dropped
            log.warning(
                "trainer: %d samples left out (%d so far): labels not encodable as UTF-8 (a "
                "job name with lone surrogates?)",
                dropped,
                self.unencodable,
            )
        return families


def _encodable(labels: dict[str, str]) -> bool:
    try:
        for name, value in labels.items():
            name.encode("utf-8")
            str(value).encode("utf-8")
    except UnicodeEncodeError:  # left out and counted by the caller
        return False
    return True


__all__ = ["TrainerCollector"]
