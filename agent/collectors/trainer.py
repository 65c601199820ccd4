"""``trainer`` collector: the ranks' prometheus-client multiprocess files, merged.

The files are read through the folder's owner (:class:`~stormwatch.agent.watch.folder.
TrainerFolder`): the running processes' files plus the accumulator that exited
processes' files were folded into, merged as ``MultiProcessCollector`` merges them but
with exact sums (:func:`stormwatch.agent.watch.merge.merge`), under the folder's lock.
Dead ranks' ``live*`` gauges are removed by the rank watcher (``mark_process_dead``), so
they disappear here; counters and histograms stay (FC-01) until their job is gone for the
retention, or starts afresh.

Also exports the folder's size: ``stormwatch_agent_multiprocess_files{job}`` (process
files holding the job's series) and ``stormwatch_agent_multiprocess_folded_files_total``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stormwatch.agent.collectors.base import new_family
from stormwatch.agent.watch.folder import TrainerFolder


class TrainerCollector:
    """Merges the ``*.db`` files of the folder (which must exist)."""

    name = "trainer"

    def __init__(self, folder: TrainerFolder) -> None:
        self._folder = folder

    def collect(self) -> Iterator[Metric]:
        with self._folder.lock:  # the series, the counts and the folded files of one moment
            families = self._folder.merge()
            counts = self._folder.file_counts()
            folded_files = self._folder.folded_files
        yield from families
        files = new_family("stormwatch_agent_multiprocess_files")
        for job, count in sorted(counts.items()):
            files.add_metric([job], float(count))
        folded = new_family("stormwatch_agent_multiprocess_folded_files_total")
        folded.add_metric([], float(folded_files))
        yield from (files, folded)


__all__ = ["TrainerCollector"]
