"""The node's multiprocess folder, owned by one object in the agent: :class:`TrainerFolder`.

Every reader of the trainer's prometheus-client files in the agent (the ``/metrics``
render, the rank watcher, the rank-health monitor) goes through one
:class:`TrainerFolder` and its lock, and the rank watcher's scan (every 1 s) keeps the
folder bounded with :meth:`TrainerFolder.maintain`:

1. the files of processes that exited are folded into the accumulator
   (:mod:`.fold`: counters, histograms and ``sum``/``max``/``min``/``mostrecent`` gauges
   keep their values exactly; ``live*`` gauges of an exited process are deleted by the
   watcher's ``mark_process_dead`` first), so the files read per render are those of
   running processes plus a fixed few, however many restarts the node saw;
2. a *fresh start* of a job drops what the folder holds of the job's earlier start:
   a job's ranks carry its instance (:attr:`stormwatch.contracts.rank_env.RankEnv.instance`:
   ``STORMWATCH_JOB_INSTANCE``, else ``SLURM_JOB_ID``, else the torchrun run id), the
   same across torchrun restarts, elastic membership changes and Slurm requeues, and new
   for a new submission. When the running ranks of a job all carry an instance other
   than the one recorded for it (``<metrics-dir>/.stormwatch-jobs.json``, so an agent
   restart remembers), the accumulator's series of that job and its exited processes'
   files are dropped: its counters start again from the new processes' values, as a new
   job's must. An elastic restart keeps them;
3. a job none of whose processes has had a file for ``retention`` seconds (the agent's
   ``--rank-retention-seconds``, 1 h, after which the watcher forgets an exited rank too)
   is dropped from the accumulator, so the jobs a node ran over its life do not pile up.

It also counts the folder's files per job (``stormwatch_agent_multiprocess_files``) and
the files folded (``stormwatch_agent_multiprocess_folded_files_total``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from prometheus_client.metrics_core import Metric

from stormwatch.agent.watch.fold import FOLD_FILE, PROCESS_FILE, Accumulator
from stormwatch.agent.watch.merge import FileReader, Folded, file_jobs, merge, prepare

log = logging.getLogger(__name__)

#: Any process's file (every type and gauge mode; group 1: the pid).
ANY_PROCESS_FILE = re.compile(r"^(?:counter|histogram|summary|gauge_[a-z]+)_(\d+)\.db$")
#: The instance last seen per job (see the module docstring).
INSTANCES_FILE = ".stormwatch-jobs.json"


class TrainerFolder:
    """The trainer's multiprocess folder as the agent owns it (module docstring).

    Args:
        metrics_dir: the folder (must exist).
        retention: seconds after its last process file before a job's folded series go.
        clock: Unix time.

    Attributes:
        lock: held by every read and by maintenance; reentrant.
        folded_files: process files folded since the agent started.
        fold_failures: files a fold could not read (left in place, retried), and rounds
            of upkeep that failed.
    """

    def __init__(
        self,
        metrics_dir: Path,
        *,
        retention: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(metrics_dir)
        self.lock = threading.RLock()
        self._retention = retention
        self._clock = clock
        self.folded_files = 0
        self.fold_failures = 0
        self._failing = False
        self._jobs_of: dict[tuple[str, int], frozenset[str]] = {}
        self._active: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        #: Per pattern read: the accumulator's files (name, inode, mtime, size), prepared.
        self._folded_cache: dict[str, tuple[list[tuple[str, int, int, int]], Folded]] = {}
        #: The running processes' files, parsed again only when their bytes change.
        self._reader = FileReader()
        with self.lock:
            self.accumulator = Accumulator(self.path)
            self._instances = self._load_instances()

    # ------------------------------------------------------------------ reads
    def paths(self, pattern: str = "*.db") -> list[str]:
        """The folder's files matching ``pattern`` (hold :attr:`lock` while using them)."""
        return sorted(str(p) for p in self.path.glob(pattern))

    def merge(self, pattern: str = "*.db", *, accumulate: bool = True) -> list[Metric]:
        """The metric families of the files matching ``pattern``, exactly merged
        (:func:`.merge.merge`), under the lock.

        Raises:
            OSError, RuntimeError, ValueError: a file cannot be read.
        """
        with self.lock:
            paths = self.paths(pattern)
            folded = [p for p in paths if FOLD_FILE.match(os.path.basename(p))]
            others = [p for p in paths if not FOLD_FILE.match(os.path.basename(p))]
            extra = self._read_folded(pattern, folded)
            return merge(others, accumulate=accumulate, extra=extra, reader=self._reader)

    def _read_folded(self, pattern: str, files: list[str]) -> Folded:
        """The accumulator's files, read once per fold and pattern (they change only when a
        fold replaces them, under the lock; a render then reads only the running
        processes' files)."""
        stamp = []
        for name in files:
            st = os.stat(name)
            stamp.append((name, st.st_ino, st.st_mtime_ns, st.st_size))
        cached = self._folded_cache.get(pattern)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        folded = prepare(files)
        self._folded_cache[pattern] = (stamp, folded)
        return folded

    def file_counts(self) -> dict[str, int]:
        """Per job: the folder's process files holding its series, as of the last
        :meth:`maintain` (running processes, and exited ones not folded yet)."""
        with self.lock:
            return dict(self._counts)

    # ------------------------------------------------------------ maintenance
    def maintain(
        self,
        exited: Callable[[int], bool],
        instances: Mapping[str, Collection[str]],
    ) -> None:
        """One round of upkeep (module docstring): fold the files of pids for which
        ``exited(pid)`` is true, drop what a fresh start or the retention ends.

        Args:
            exited: whether a pid's process has exited (it writes no more); asked only
                after the folder was listed, so a file's writer existed when it is asked
                (:class:`~.trainer_files.Exited`).
            instances: per job, the instances its running ranks on this node carry.

        A failure (the folder cannot be listed, the accumulator cannot be written: a full
        disk) is logged at warning once until a round succeeds and counted in
        :attr:`fold_failures`; nothing is lost (the exited files stay), and the scan that
        called goes on detecting exits.
        """
        try:
            self._maintain(exited, instances)
        except OSError:
            self.fold_failures += 1
            if not self._failing:
                log.warning("folding %s failed (retried every scan)", self.path, exc_info=True)
            self._failing = True
            return
        if self._failing:
            log.info("folding %s works again", self.path)
        self._failing = False

    def _maintain(
        self,
        exited: Callable[[int], bool],
        instances: Mapping[str, Collection[str]],
    ) -> None:
        with self.lock:
            now = self._clock()
            names = os.listdir(self.path)
            self._reader.retain({str(self.path / name) for name in names})
            jobs_of = self._file_jobs(names)
            counts: dict[str, int] = {}
            for jobs in jobs_of.values():
                for job in jobs:
                    counts[job] = counts.get(job, 0) + 1
                    self._active[job] = now
            for job in self.accumulator.jobs:
                self._active.setdefault(job, now)
            fresh = self._fresh_starts(instances)
            gone = {
                job
                for job in self.accumulator.jobs
                if job not in counts and now - self._active[job] >= self._retention
            }
            dead = [
                self.path / name
                for name in names
                if (match := PROCESS_FILE.match(name)) is not None and exited(int(match[2]))
            ]
            drop = (fresh | gone) & (self.accumulator.jobs | set(counts))
            if dead or drop:
                result = self.accumulator.fold(dead, drop_jobs=drop)
                self.folded_files += len(result.folded)
                self.fold_failures += len(result.unreadable)
                for name in result.folded:
                    for job in jobs_of.get(name, ()):
                        counts[job] -= 1
                if result.dropped_series:
                    log.info(
                        "dropped %d folded series of %s (%s)",
                        result.dropped_series,
                        ", ".join(sorted(drop)),
                        "fresh start" if fresh & drop else "retention",
                    )
            self._counts = {job: n for job, n in counts.items() if n > 0}
            self._forget(gone, instances)

    def _file_jobs(self, names: list[str]) -> dict[str, frozenset[str]]:
        """Per process file name: the jobs of its series (read once per file)."""
        found: dict[str, frozenset[str]] = {}
        seen: set[tuple[str, int]] = set()
        for name in names:
            if ANY_PROCESS_FILE.match(name) is None:
                continue
            path = self.path / name
            try:
                key = (name, path.stat().st_ino)
            except FileNotFoundError:
                continue  # deleted since the listing (mark_process_dead): not there
            seen.add(key)
            jobs = self._jobs_of.get(key)
            if jobs is None:
                try:
                    jobs = file_jobs(path)
                except (OSError, RuntimeError):
                    continue  # being created, or deleted: read again next round
                if jobs:
                    self._jobs_of[key] = jobs
            found[name] = jobs
        for key in set(self._jobs_of) - seen:
            del self._jobs_of[key]
        return found

    def _fresh_starts(self, instances: Mapping[str, Collection[str]]) -> set[str]:
        """Jobs whose running ranks carry a new instance (module docstring, 2)."""
        fresh: set[str] = set()
        changed = False
        for job, tokens in instances.items():
            known = self._instances.get(job)
            if known in tokens or len(set(tokens)) != 1:
                continue  # the same start, or several at once: wait until one remains
            token = next(iter(tokens))
            if known is not None:
                log.info("job %s started afresh (instance %s, was %s)", job, token, known)
                fresh.add(job)
            self._instances[job] = token
            changed = True
        if changed:
            self._save_instances()
        return fresh

    def _forget(self, gone: set[str], instances: Mapping[str, Collection[str]]) -> None:
        for job in gone:
            self._active.pop(job, None)
        stale = [job for job in self._instances if job not in instances and job not in self._active]
        if stale:
            for job in stale:
                del self._instances[job]
            self._save_instances()

    def _load_instances(self) -> dict[str, str]:
        path = self.path / INSTANCES_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except ValueError:
            log.warning("ignoring the unreadable %s", path)
            return {}
        found = data.get("instances") if isinstance(data, dict) else None
        if not isinstance(found, dict):
            return {}
        return {str(k): str(v) for k, v in found.items()}

    def _save_instances(self) -> None:
        path = self.path / INSTANCES_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"version": 1, "instances": self._instances}), encoding="utf-8")
        os.replace(tmp, path)


__all__ = ["ANY_PROCESS_FILE", "INSTANCES_FILE", "TrainerFolder"]
