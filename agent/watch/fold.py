"""The accumulator of exited processes' prometheus-client multiprocess files.

prometheus-client's multiprocess mode leaves one file per process and type in the
folder (``counter_<pid>.db``, ``histogram_<pid>.db``, ``gauge_<mode>_<pid>.db``), and a
reader merges every file at every read. A rank restart leaves a new set, so the
agent's render cost grew with every restart the node ever saw (issue 17, item 4: 100
files 7 ms a render, 1,600 files 74 ms). :class:`Accumulator` folds the files of
exited processes into one set of files in the library's own format
(``prometheus_client.mmap_dict.MmapedDict``, keys made by the library's writer):
``<prefix>_fold.db`` (``counter_fold.db``, ``histogram_fold.db``, ``gauge_max_fold.db``
...), which any ``MultiProcessCollector`` reads like any process's file.

What a fold keeps, by the file's type, as prometheus-client merges it
(``MultiProcessCollector._accumulate_metrics``):

* counters, histograms (per bucket, ``_sum``), summaries and ``sum`` gauges: the sum,
  *exact*. It is held as Shewchuk's non-overlapping partials (Python's ``math.fsum``
  algorithm): ``<prefix>_fold.db`` the correctly rounded total, ``<prefix>_fold.<n>.db``
  the exact remainder when a double cannot hold it (none for integer counts). With
  :func:`.merge.merge` (``math.fsum`` over every file) a series reads the same, to the last
  bit, before and after a fold, so a counter never goes backwards (Prometheus takes any
  decrease for a reset);
* ``max``, ``min`` gauges: the largest / smallest value; ``mostrecent`` gauges: the
  value with the latest timestamp (as the library picks it);
* not folded: ``live*`` gauges (an exited process's are deleted by
  ``mark_process_dead``: the rank watcher's job) and ``all`` gauges (the writer's pid is
  their ``pid`` label, part of the series: an ``all`` gauge's file stays as it is).

A fold is crash-safe, and one process at a time folds a folder (``flock`` on
``.stormwatch-fold.lock``; a second agent pointed at the same folder skips its folds
instead of racing the first): the new accumulator files are written beside the old ones
(``*.fold-tmp``), then an intent file names the renames and the exited files to delete
(with their inodes), then both are done and the intent removed. An agent that died in
between rolls the intent forward when it next opens the folder; without an intent the
temporary files are discarded, so a file is never counted twice nor lost. Readers in
the agent take the folder's lock (:class:`~.trainer_files.TrainerFolder`), so no read
sees a fold half done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.mmap_dict import MmapedDict

from stormwatch.agent.watch.merge import file_jobs, file_values, grow, key_job, split_total

log = logging.getLogger(__name__)

#: How the values of one series combine, by file prefix (the library's merge).
SUM, MAX, MIN, LATEST = "sum", "max", "min", "latest"
FOLDED_PREFIXES: dict[str, str] = {
    "counter": SUM,
    "histogram": SUM,
    "summary": SUM,
    "gauge_sum": SUM,
    "gauge_max": MAX,
    "gauge_min": MIN,
    "gauge_mostrecent": LATEST,
}
_PREFIXES = "|".join(FOLDED_PREFIXES)
#: A process's file that a fold takes once the process exited (group 2: the pid).
PROCESS_FILE = re.compile(rf"^({_PREFIXES})_(\d+)\.db$")
#: The accumulator's files (group 2: the remainder's index, absent for the total).
FOLD_FILE = re.compile(rf"^({_PREFIXES})_fold(?:\.(\d+))?\.db$")
#: Written while a fold is committed (see the module docstring).
INTENT = ".stormwatch-fold-intent.json"
#: Held (``flock``) by whoever folds or recovers: one process at a time per folder.
LOCK = ".stormwatch-fold.lock"
TMP_SUFFIX = ".fold-tmp"

#: One series' state: exact partials (sum kinds) or ``(value, timestamp)``.
Entry = list[float] | tuple[float, float]


def _combine(how: str, old: Entry | None, value: float, timestamp: float) -> Entry:
    if how == SUM:
        return grow([] if old is None else list(old), value)
    if old is None:
        return (value, timestamp)
    assert isinstance(old, tuple)
    if how == MAX:
        return (value, timestamp) if value > old[0] else old
    if how == MIN:
        return (value, timestamp) if value < old[0] else old
    return (value, timestamp) if timestamp > old[1] else old  # LATEST, as the library


@dataclasses.dataclass(frozen=True)
class FoldResult:
    """What one :meth:`Accumulator.fold` did.

    Attributes:
        folded: exited processes' files folded in (their names).
        unreadable: exited processes' files left in place because they could not be read.
        dropped_series: accumulator series removed (of the jobs asked).
    """

    folded: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()
    dropped_series: int = 0


class Accumulator:
    """The folded files of one multiprocess folder (see the module docstring).

    Not thread-safe: the caller serialises folds and reads (the folder's lock).
    Opening it completes or discards a fold that a crash interrupted.

    Args:
        folder: the multiprocess folder (must exist).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._busy_logged = False
        self.recover()
        self.jobs: frozenset[str] = self._read_jobs()

    # ------------------------------------------------------------------ reads
    def files(self) -> list[Path]:
        """The accumulator's files now."""
        return sorted(p for p in self.folder.glob("*_fold*.db") if FOLD_FILE.match(p.name))

    def _read_jobs(self) -> frozenset[str]:
        jobs: set[str] = set()
        for path in self.files():
            try:
                jobs |= file_jobs(path)
            except (OSError, RuntimeError):
                log.warning("cannot read the accumulator file %s", path, exc_info=True)
        return frozenset(jobs)

    def _read(self, prefix: str) -> dict[str, Entry]:
        how = FOLDED_PREFIXES[prefix]
        state: dict[str, Entry] = {}
        for path in self.files():
            match = FOLD_FILE.match(path.name)
            assert match is not None
            if match[1] != prefix:
                continue
            for key, value, timestamp, _ in file_values(str(path)):
                state[key] = _combine(how, state.get(key), value, timestamp)
        return state

    # ------------------------------------------------------------------- fold
    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[bool]:
        """Whether this process holds the folder's fold lock (:data:`LOCK`) for the block."""
        fd = os.open(self.folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # releases the lock

    def fold(self, exited: Collection[Path], *, drop_jobs: Collection[str] = ()) -> FoldResult:
        """Fold the files of exited processes in, and remove the series of ``drop_jobs``
        (from the accumulator and from the files folded now).

        ``exited`` must name files whose process has exited (:data:`PROCESS_FILE`); a file
        that cannot be read is left in place (reported in the result) and retried by the
        next fold. Another process folding the folder now: nothing is done (logged).

        Raises:
            OSError: the folder cannot be written.
        """
        with self._exclusive() as mine:
            if not mine:
                if not self._busy_logged:
                    log.warning("another process folds %s: this agent's folds wait", self.folder)
                self._busy_logged = True
                return FoldResult()
            self._busy_logged = False
            self.recover_locked()
            return self._fold(exited, drop_jobs)

    def _fold(self, exited: Collection[Path], drop_jobs: Collection[str]) -> FoldResult:
        drop = frozenset(drop_jobs)
        by_prefix: dict[str, list[Path]] = {}
        for path in exited:
            match = PROCESS_FILE.match(path.name)
            if match is not None:
                by_prefix.setdefault(match[1], []).append(path)
        prefixes = set(by_prefix)
        if drop & self.jobs:
            prefixes |= {m[1] for p in self.files() if (m := FOLD_FILE.match(p.name))}
        states: dict[str, dict[str, Entry]] = {}
        folded: list[Path] = []
        unreadable: list[str] = []
        dropped = 0
        for prefix in sorted(prefixes):
            how = FOLDED_PREFIXES[prefix]
            state = self._read(prefix)
            for path in by_prefix.get(prefix, []):
                try:
                    values = file_values(str(path))
                except (OSError, RuntimeError):
                    log.warning("cannot fold %s (kept; retried)", path, exc_info=True)
                    unreadable.append(path.name)
                    continue
                for key, value, timestamp, _ in values:
                    if drop and key_job(key) in drop:
                        continue
                    state[key] = _combine(how, state.get(key), value, timestamp)
                folded.append(path)
            if drop:
                gone = [key for key in state if key_job(key) in drop]
                dropped += len(gone)
                for key in gone:
                    del state[key]
            states[prefix] = state
        if folded or dropped:
            self._commit(states, folded)
        return FoldResult(tuple(p.name for p in folded), tuple(unreadable), dropped)

    def _commit(self, states: dict[str, dict[str, Entry]], folded: list[Path]) -> None:
        """Write the new accumulator files of ``states``' prefixes, then swap them in and
        delete ``folded``, through the intent file."""
        renames: list[list[str]] = []
        keep: set[str] = set()
        for prefix, state in states.items():
            layers: list[list[tuple[str, float, float]]] = []
            for key, entry in state.items():
                parts = (
                    [(v, 0.0) for v in split_total(entry)] if isinstance(entry, list) else [entry]
                )
                for i, (value, timestamp) in enumerate(parts):
                    while len(layers) <= i:
                        layers.append([])
                    layers[i].append((key, value, timestamp))
            for i, layer in enumerate(layers):
                final = f"{prefix}_fold.db" if i == 0 else f"{prefix}_fold.{i}.db"
                self._write(self.folder / (final + TMP_SUFFIX), layer)
                renames.append([final + TMP_SUFFIX, final])
                keep.add(final)
        remove: list[tuple[str, int | None]] = [
            (p.name, None)
            for p in self.files()
            if (m := FOLD_FILE.match(p.name)) and m[1] in states and p.name not in keep
        ]
        for path in folded:
            try:
                remove.append((path.name, path.stat().st_ino))
            except FileNotFoundError:
                continue  # already gone: nothing to delete
        intent: dict[str, Any] = {"version": 1, "rename": renames, "remove": remove}
        tmp = self.folder / (INTENT + TMP_SUFFIX)
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(intent, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.folder / INTENT)
        self._sync_folder()
        self._apply(intent)
        self.jobs = self._read_jobs()

    @staticmethod
    def _write(path: Path, entries: list[tuple[str, float, float]]) -> None:
        path.unlink(missing_ok=True)
        table = MmapedDict(str(path))
        try:
            for key, value, timestamp in entries:
                table.write_value(key, value, timestamp)
        finally:
            table.close()
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())

    def _apply(self, intent: dict[str, Any]) -> None:
        for tmp, final in intent["rename"]:
            source = self.folder / str(tmp)
            if source.exists():
                os.replace(source, self.folder / str(final))
        for name, inode in intent["remove"]:
            path = self.folder / str(name)
            try:
                if inode is None or path.stat().st_ino == inode:
                    path.unlink()
            except FileNotFoundError:
                continue  # removed before a crash: done already
        self._sync_folder()
        (self.folder / INTENT).unlink(missing_ok=True)

    def _sync_folder(self) -> None:
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def recover(self) -> None:
        """Finish a fold that a crash interrupted (its intent file is there), else discard
        its temporary files; nothing while another process folds the folder."""
        if not self.folder.is_dir():
            return
        with self._exclusive() as mine:
            if mine:
                self.recover_locked()

    def recover_locked(self) -> None:
        """:meth:`recover`, the fold lock held."""
        intent_path = self.folder / INTENT
        try:
            intent = json.loads(intent_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            intent = None
        except ValueError:  # torn before its rename, cannot be: the rename is atomic
            log.warning("discarding the unreadable fold intent %s", intent_path)
            intent_path.unlink(missing_ok=True)
            intent = None
        if intent is not None:
            log.info("completing an interrupted fold in %s", self.folder)
            self._apply(intent)
        for stray in self.folder.glob("*" + TMP_SUFFIX):
            stray.unlink(missing_ok=True)


__all__ = [
    "FOLDED_PREFIXES",
    "FOLD_FILE",
    "INTENT",
    "LOCK",
    "PROCESS_FILE",
    "Accumulator",
    "FoldResult",
]
