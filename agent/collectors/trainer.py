"""``trainer`` collector: the ranks' prometheus-client multiprocess files, merged.

The files are read through the folder's owner (:class:`~stormwatch.agent.watch.folder.
TrainerFolder`): the running processes' files plus the accumulator that exited
processes' files were folded into, merged as ``MultiProcessCollector`` merges them but
with exact sums (:func:`stormwatch.agent.watch.merge.merge`), under the folder's lock.
Dead ranks' ``live*`` gauges are removed by the rank watcher (``mark_process_dead``), so
they disappear here; counters and histograms stay (FC-01) until their job is gone for the
retention, or starts afresh.

Also exports the folder's size: ``stormwatch_agent_multiprocess_files{training_job}``
(process files holding the job's series) and ``stormwatch_agent_multiprocess_folded_files_total``.

A sample whose labels cannot be encoded as UTF-8 (a job name with lone surrogates, from a
rank's environment that was not UTF-8) is left out and counted
(:attr:`TrainerCollector.unencodable`, one warning each time more are seen); the text
exposition would otherwise fail, and with it every job's metrics on the node.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from stormwatch.agent.collectors.base import new_family
from stormwatch.agent.watch.folder import TrainerFolder
from stormwatch.contracts.labels import TRAINING_JOB_LABEL

log = logging.getLogger(__name__)


class TrainerCollector:
    """Merges the ``*.db`` files of the folder (which must exist)."""

    name = "trainer"

    def __init__(self, folder: TrainerFolder) -> None:
        self._folder = folder
        #: Samples left out so far because their labels cannot be encoded as UTF-8.
        self.unencodable = 0
        #: Family name -> (the samples merged at the last collect, those kept): an idle
        #: job's samples are the same objects from one render to the next (the merge
        #: reuses its result when no file changed), so they are not checked again.
        self._checked: dict[str, tuple[list[Sample], list[Sample]]] = {}

    def collect(self) -> Iterator[Metric]:
        with self._folder.lock:  # the series, the counts and the folded files of one moment
            families = self._folder.merge()
            counts = self._folder.file_counts()
            folded_files = self._folder.folded_files
        yield from self._encodable_only(families)
        files = new_family("stormwatch_agent_multiprocess_files")
        for job, count in sorted(counts.items()):
            if _encodable({TRAINING_JOB_LABEL: job}):
                files.add_metric([job], float(count))
        folded = new_family("stormwatch_agent_multiprocess_folded_files_total")
        folded.add_metric([], float(folded_files))
        yield from (files, folded)

    def _encodable_only(self, families: list[Metric]) -> list[Metric]:
        dropped = 0
        checked: dict[str, tuple[list[Sample], list[Sample]]] = {}
        for family in families:
            last = self._checked.get(family.name)
            if last is not None and last[0] == family.samples:
                checked[family.name] = last
                family.samples = list(last[1])
                continue
            kept = [s for s in family.samples if _encodable(s.labels)]
            dropped += len(family.samples) - len(kept)
            checked[family.name] = (list(family.samples), kept)
            family.samples = list(kept)
        self._checked = checked
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
