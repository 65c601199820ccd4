"""``ranks`` collector: the rank watcher's view (up, unexpected exits, last progress,
ranks orphaned by their launcher's death) and, with a :class:`~stormwatch.agent.watch.monitor.RankHealth`, hangs, collective lag
and stragglers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric

from stormwatch.agent.collectors.base import new_family
from stormwatch.agent.errors import CollectorError
from stormwatch.agent.watch.monitor import RankHealth
from stormwatch.agent.watch.ranks import RankWatcher


class RanksCollector:
    """Exports :class:`RankWatcher` state.

    ``export_age=False`` leaves ``stormwatch_rank_watcher_scan_age_seconds`` to
    :class:`~stormwatch.agent.exposition.LiveAges` (rendered per scrape).

    Raises (from ``collect``):
        CollectorError: the watcher has not completed a scan, or its last scan failed.
    """

    name = "ranks"

    def __init__(
        self,
        watcher: RankWatcher,
        *,
        clock: Callable[[], float] = time.time,
        health: RankHealth | None = None,
        export_age: bool = True,
    ) -> None:
        self._watcher = watcher
        self._export_age = export_age
        self._clock = clock
        self._health = health

    def collect(self) -> Iterator[Metric]:
        scanned = self._watcher.last_scan_at
        if scanned is None or self._watcher.last_error is not None:
            raise CollectorError(f"rank watcher: {self._watcher.last_error or 'no scan yet'}")
        up = new_family("stormwatch_rank_up")
        for info in self._watcher.ranks():
            up.add_metric([info.job, str(info.rank)], 1.0 if info.alive else 0.0)
        exits = new_family("stormwatch_rank_unexpected_exits_total")
        for (job, rank), n in sorted(self._watcher.unexpected_exits().items()):
            exits.add_metric([job, str(rank)], float(n))
        by_reason = new_family("stormwatch_rank_exits_total")
        for (job, rank, reason), n in sorted(self._watcher.exit_counts().items()):
            by_reason.add_metric([job, str(rank), reason], float(n))
        exit_times = new_family("stormwatch_rank_last_exit_timestamp_seconds")
        for (job, rank, reason), stamp in sorted(self._watcher.last_exit_times().items()):
            exit_times.add_metric([job, str(rank), reason], stamp)
        stop_times = new_family("stormwatch_rank_stop_requested_timestamp_seconds")
        for (job, rank), stamp in sorted(self._watcher.stop_requests().items()):
            stop_times.add_metric([job, str(rank)], stamp)
        last_code = new_family("stormwatch_rank_last_exit_code")
        for (job, rank), code in sorted(self._watcher.last_exit_codes().items()):
            last_code.add_metric([job, str(rank)], float(code))
        connector = new_family("stormwatch_proc_connector_up")
        connector.add_metric([], 1.0 if self._watcher.exits.available else 0.0)
        progress = new_family("stormwatch_rank_last_progress_timestamp_seconds")
        for (job, rank), stamp in sorted(self._watcher.last_progress().items()):
            progress.add_metric([job, str(rank)], stamp)
        orphaned = new_family("stormwatch_rank_orphaned_seconds")
        longest: dict[tuple[str, int], float] = {}
        for orphan in self._watcher.orphaned.orphans():
            key = (orphan.job, orphan.rank)
            longest[key] = max(longest.get(key, 0.0), self._clock() - orphan.orphaned_at)
        for (job, rank), seconds in sorted(longest.items()):
            orphaned.add_metric([job, str(rank)], max(0.0, seconds))
        age = new_family("stormwatch_rank_watcher_scan_age_seconds")
        age.add_metric([], max(0.0, self._clock() - scanned))
        yield from (up, exits, by_reason, exit_times, stop_times, last_code, connector)
        yield from (progress, orphaned)
        if self._export_age:
            yield age
        if self._health is not None:
            yield from self._health_families()

    def _health_families(self) -> Iterator[Metric]:
        assert self._health is not None
        view = self._health.view()
        tables: tuple[tuple[str, dict[tuple[str, int], float]], ...] = (
            ("stormwatch_rank_hung", {k: float(v) for k, v in view.hung.items()}),
            ("stormwatch_rank_hangs_total", {k: float(v) for k, v in view.hangs.items()}),
            ("stormwatch_rank_stall_threshold_seconds", view.stall_threshold),
            ("stormwatch_rank_collective_lag", view.lag),
            ("stormwatch_rank_straggler_score", view.straggler_score),
            ("stormwatch_rank_straggler", {k: float(v) for k, v in view.straggler.items()}),
        )
        for name, values in tables:
            family = new_family(name)
            for (job, rank), value in sorted(values.items()):
                family.add_metric([job, str(rank)], value)
            yield family


__all__ = ["RanksCollector"]
