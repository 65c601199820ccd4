"""The trainer's multiprocess folder as the agent reads it: per-rank samples and dead pids.

The trainer writes prometheus-client multiprocess files into the node's metrics
folder (docs/ARCHITECTURE.md, "Trainer -> agent telemetry"). The rank watcher reads
the heartbeat and step gauges from them and marks dead ranks' files; the health
monitor reads the per-step gauges, the phase deadlines and the collective counters. Both go through
:class:`TrainerFiles`, so a sample's rank is found, and a file that cannot be read is
reported, in one way; and both read through the folder's one owner
(:class:`~.folder.TrainerFolder`: its lock, exact merge, and the accumulator that exited
processes' files are folded into), so a counter file of every rank restart the node saw
is not merged again at every scan.

Current-state gauges are ``livemax`` gauges, in ``gauge_live*_<pid>.db`` files: reading
only those skips the ranks' histograms and counters, which dominate the folder.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.multiprocess import mark_process_dead

from stormwatch.agent.watch.folder import TrainerFolder
from stormwatch.agent.watch.procs import ProcEntry, nested_pids, pid_dead
from stormwatch.contracts.labels import TRAINING_JOB_LABEL
from stormwatch.contracts.rank_env import RankKey

log = logging.getLogger(__name__)

#: Files of the live gauges (current state of a rank; ``multiprocess_mode="livemax"``).
LIVE_GAUGES = "gauge_live*_*.db"
#: Files of the counters.
COUNTERS = "counter_*.db"
#: What the agent reads (docs/ARCHITECTURE.md lists them): live gauges of a rank ...
HEARTBEAT_METRIC = "stormwatch_train_last_step_timestamp_seconds"
#: the progress heartbeat (step marks, completed collectives, phase boundaries, checkpoints;
#: a job without step marks has only this one) ...
PROGRESS_METRIC = "stormwatch_train_last_progress_timestamp_seconds"
#: until when a phase (checkpoint save/load, eval, data wait) may pause progress ...
PHASE_DEADLINE_METRIC = "stormwatch_train_phase_deadline_timestamp_seconds"
STEP_METRIC = "stormwatch_train_step"
COMPUTE_METRIC = "stormwatch_train_step_compute_seconds"
WAIT_METRIC = "stormwatch_train_step_collective_wait_seconds"
#: ... and a counter's sample (the ``_total`` sample of ``stormwatch_collective_calls``).
CALLS_SAMPLE = "stormwatch_collective_calls_total"

_LIVE_FILE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")

#: Per sample name, per ``(job, rank)``: the value read.
RankSamples = dict[str, dict[RankKey, float]]


def keep_max(old: float, new: float) -> float:
    """A gauge written by several processes of one rank: the latest is the largest."""
    return max(old, new)


def add(old: float, new: float) -> float:
    """A counter split over label values (``op``, ...): their sum."""
    return old + new


class TrainerFiles:
    """Reads per-rank samples from the trainer's multiprocess folder.

    Args:
        metrics_dir: the trainer's multiprocess folder.
        reader: who reads (``rank watcher``, ``rank health``), for the log.
        folder: the folder's owner shared by the agent's readers (default: one of its own).

    Attributes:
        read_errors: reads that failed (a half-written file, a file removed while it
            was read); each returns no samples, and the next read tries again.
    """

    def __init__(
        self, metrics_dir: Path, *, reader: str, folder: TrainerFolder | None = None
    ) -> None:
        self._dir = Path(metrics_dir)
        self.folder = folder if folder is not None else TrainerFolder(self._dir)
        self._reader = reader
        self._failing = False
        self.read_errors = 0

    def read(
        self,
        pattern: str,
        names: Collection[str],
        *,
        combine: Callable[[float, float], float] = keep_max,
    ) -> RankSamples:
        """The samples named ``names`` (sample names, e.g. ``stormwatch_train_step`` or
        ``stormwatch_collective_calls_total``) of the files matching ``pattern``, per
        ``(training_job, rank)`` label pair, values of one rank merged with ``combine``.

        Samples without a ``training_job`` label or an integer ``rank`` label are skipped. A read
        that fails returns no samples: logged at warning once until a read succeeds
        again, and counted in :attr:`read_errors`; it must not stop exit detection.
        """
        found: RankSamples = {name: {} for name in names}
        for sample, key in self._samples(pattern, found):
            target = found[sample.name]
            old = target.get(key)
            target[key] = sample.value if old is None else combine(old, sample.value)
        return found

    def read_by_label(self, pattern: str, name: str, label: str) -> dict[RankKey, dict[str, float]]:
        """The samples named ``name`` of the files matching ``pattern``, per ``(job, rank)``
        and value of ``label`` (e.g. each phase's deadline); samples without that label are
        skipped, values of one rank and label value merged with :func:`keep_max`. A read
        that fails returns nothing, as :meth:`read`."""
        found: dict[RankKey, dict[str, float]] = {}
        for sample, key in self._samples(pattern, {name}):
            value = sample.labels.get(label)
            if value is None:
                continue
            per_rank = found.setdefault(key, {})
            old = per_rank.get(value)
            per_rank[value] = sample.value if old is None else keep_max(old, sample.value)
        return found

    def _samples(self, pattern: str, names: Collection[str]) -> Iterator[tuple[Any, RankKey]]:
        """``(sample, (job, rank))`` of every sample named in ``names`` in the merged files
        matching ``pattern`` (none when the read fails: logged once, counted)."""
        try:
            families = self.folder.merge(pattern, accumulate=False)
        except Exception:  # a half-written file: try again next time
            self.read_errors += 1
            if not self._failing:
                log.warning(
                    "%s: reading the trainer's files %s/%s failed (retried every scan)",
                    self._reader,
                    self._dir,
                    pattern,
                    exc_info=True,
                )
            self._failing = True
            return
        if self._failing:
            log.info("%s: reading the trainer's files works again", self._reader)
        self._failing = False
        for family in families:
            for sample in family.samples:
                if sample.name not in names:
                    continue
                try:
                    key = (sample.labels[TRAINING_JOB_LABEL], int(sample.labels["rank"]))
                except (KeyError, ValueError):
                    continue  # not a rank's sample (the trainer labels every one it writes)
                yield sample, key

    def mark_dead(self, table: Mapping[int, ProcEntry]) -> None:
        """``mark_process_dead`` for every dead pid that still has live-gauge files, so dead
        ranks' current-state gauges disappear while their counters stay (FC-01).

        A pid counts as dead only when it is dead now *and* was gone or a zombie in
        ``table``, the process table of the scan that updated the ranks' states: a rank
        that died after the table was read keeps its gauges until the next scan, which
        also records its exit, so a scrape never sees its gauges gone while its
        ``stormwatch_rank_up`` is still 1.
        """
        with self.folder.lock:
            exited = Exited(table)
            for path in self._dir.glob(LIVE_GAUGES):
                match = _LIVE_FILE.match(path.name)
                if match is None:
                    continue
                pid = int(match[1])
                if exited(pid):
                    log.debug("marking pid %d dead in %s", pid, self._dir)
                    mark_process_dead(pid, str(self._dir))


class Exited:
    """Whether the writer of a multiprocess file named by ``pid`` has exited: dead now, gone
    or a zombie in ``table`` (the process table of the scan that updated the ranks' states;
    see :meth:`TrainerFiles.mark_dead`), and no process has that pid inside a nested PID
    namespace (a rank in a pod names its files by its pid there: :func:`.procs.nested_pids`,
    read at the first pid that passes the other two tests, so after the files were listed).
    Make one per listing of the folder.
    """

    def __init__(self, table: Mapping[int, ProcEntry]) -> None:
        self._table = table
        self._nested: frozenset[int] | None = None

    def __call__(self, pid: int) -> bool:
        entry = self._table.get(pid)
        if not ((entry is None or entry.zombie) and pid_dead(pid)):
            return False
        if self._nested is None:
            self._nested = nested_pids()
        return pid not in self._nested


__all__ = [
    "CALLS_SAMPLE",
    "COMPUTE_METRIC",
    "COUNTERS",
    "HEARTBEAT_METRIC",
    "LIVE_GAUGES",
    "PHASE_DEADLINE_METRIC",
    "PROGRESS_METRIC",
    "STEP_METRIC",
    "WAIT_METRIC",
    "Exited",
    "RankSamples",
    "TrainerFiles",
    "add",
    "keep_max",
]
