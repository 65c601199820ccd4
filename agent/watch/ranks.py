"""The rank watcher: which training ranks run on this node, and how they ended.

Every ``interval`` seconds (1 s), and at once when the proc connector reports the exit of
a tracked rank (:meth:`.proc_exits.ExitSource.on_exit`), one scan:

1. reads the ranks' heartbeats (the later of ``stormwatch_train_last_step_timestamp_seconds``
   and the progress heartbeat ``stormwatch_train_last_progress_timestamp_seconds``, which
   completed collectives advance too, so a job without step marks has one) and steps
   from the multiprocess files (:mod:`.trainer_files`), *before* dead ranks' live gauges go;
2. lists processes (psutil; while no process was created, exec'd or ended since, the last
   listing) and finds rank launchers (:func:`is_rank_launcher`: torchrun agents, and Slurm
   step daemons for ``srun ... stormwatch run``) (steps 2 and 3: :mod:`.discovery`);
3. among their descendants, takes the topmost process per rank whose environment has
   ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and ``TORCHELASTIC_RUN_ID`` (or srun's variables
   with ``STORMWATCH_RUN_ID``: :func:`stormwatch.contracts.rank_env.rank_env`; job:
   ``STORMWATCH_JOB``, else the run id) and that this node *claims*: its metrics folder
   (``--metrics-dir`` after ``train`` on its command line, else ``STORMWATCH_METRICS_DIR``;
   resolved) is this agent's metrics directory, or it has no metrics folder at all and the
   watcher claims unlabelled ranks (``claim_unlabelled``: right for one agent per host,
   wrong in the lab, where all nodes share one PID namespace: ``--no-claim-unlabelled-ranks``);
   claimed rank processes under no launcher are *orphans* (:mod:`.orphans`), still ranks;
4. notices tracked ranks that exited (gone, zombie, or replaced by a new pid) and counts
   an *unexpected* exit unless ``<metrics-dir>/rank<R>.done`` was written during that
   process's life and its exit status, when known, is 0 (the API writes the marker at a
   clean interpreter exit, which ``sys.exit(3)`` is too), or it was a stop
   (:func:`.rankinfo.is_stop`: its ``rank<R>.stopping``, written at SIGTERM, whatever its
   status; or a SIGTERM exit before its telemetry could mark it, in a job using the API),
   unless this agent's own ``kill_rank`` fault sent the SIGTERM (:meth:`note_fault_signal`);
5. calls ``mark_process_dead(pid, metrics_dir)`` for every dead pid that still has
   live-gauge files, so dead ranks' current-state gauges disappear while their counters
   stay (FC-01) (:meth:`.trainer_files.TrainerFiles.mark_dead`);
6. keeps the folder bounded (:meth:`.folder.TrainerFolder.maintain`): the other files of
   exited processes are folded into one accumulator (counters keep their totals), a job's
   fresh start drops its earlier start's series, and jobs gone for ``forget_after`` go.

A dead rank's last heartbeat is kept (it goes stale, a "no progress" alert fires) until a
restarted rank reports a newer one. A rank that finished cleanly is forgotten at once; one
that died ``forget_after`` s after its exit (counters are never dropped).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil
from opentelemetry import trace

from stormwatch.agent.watch.discovery import Found, RankFinder
from stormwatch.agent.watch.folder import TrainerFolder
from stormwatch.agent.watch.orphans import OrphanInfo, OrphanTracker
from stormwatch.agent.watch.proc_exits import ExitSource, UnavailableExits
from stormwatch.agent.watch.procs import (
    ProcEntry,
    exit_status,
    is_rank_launcher,
    is_torchrun_agent,
    same_time,
)
from stormwatch.agent.watch.rankinfo import (
    RankExit,
    RankInfo,
    exit_attributes,
    is_stop,
    marker_time,
)
from stormwatch.agent.watch.trainer_files import (
    HEARTBEAT_METRIC,
    LIVE_GAUGES,
    PROGRESS_METRIC,
    STEP_METRIC,
    Exited,
    TrainerFiles,
)
from stormwatch.contracts.rank_env import RankEnv, RankKey

log = logging.getLogger(__name__)

#: Seconds a scan waits for the proc connector's event of a rank that is gone (it is
#: sent at exit, before torchrun reaps; this only covers the reader thread's lag).
EXIT_EVENT_WAIT = 0.2


@dataclasses.dataclass
class _Tracked:
    env: RankEnv
    process: psutil.Process
    pid: int
    create_time: float
    alive: bool = True
    exited_at: float | None = None


class RankWatcher:
    """Finds rank processes and tracks their lives.

    Args:
        metrics_dir: the trainer's multiprocess directory (also holds ``rank<R>.done``).
        interval: seconds between scans in the background thread.
        forget_after: seconds after which an exited rank's series are dropped.
        clock: Unix time.
        is_agent: ``(name, cmdline) -> bool`` recognising rank launchers.
        tracer: records a ``rank.exit`` span per exit noticed (default: no-op).
        claim_unlabelled: claim ranks that name no metrics folder at all (default True: on
            a real node one agent owns every rank of the host; the lab, several agents in
            one PID namespace, sets it False).
        on_exit: called (on the scan thread) with a :class:`RankExit` per exit noticed, after
            the scan's listeners: who reads an exit event then ``/metrics`` finds it in both.
        exits: exit statuses (:func:`~.proc_exits.open_exit_source`; its event count lets
            scans reuse the process listing); None: only from zombies, every scan lists all.
        on_orphan: called (on the scan thread) per rank process newly seen without its
            launcher (:mod:`.orphans`).
    """

    def __init__(
        self,
        metrics_dir: Path,
        *,
        interval: float = 0.5,
        forget_after: float = 3600.0,
        clock: Callable[[], float] = time.time,
        is_agent: Callable[[str, Sequence[str]], bool] = is_rank_launcher,
        tracer: trace.Tracer | None = None,
        claim_unlabelled: bool = True,
        on_exit: Callable[[RankExit], None] | None = None,
        exits: ExitSource | None = None,
        on_orphan: Callable[[OrphanInfo], None] | None = None,
    ) -> None:
        self._dir = Path(metrics_dir)
        self.exits: ExitSource = exits or UnavailableExits("not configured")
        self._exit_counts: collections.Counter[tuple[str, int, str]] = collections.Counter()
        self._last_exit_code: dict[RankKey, int] = {}
        self._listeners: list[Callable[[], None]] = []
        self._on_exit = on_exit or (lambda gone: None)
        #: Claimed rank processes no live launcher is above, as of the last scan.
        self.orphaned = OrphanTracker(on_orphan)
        self._finder = RankFinder(
            metrics_dir, is_agent=is_agent, claim_unlabelled=claim_unlabelled,
            changes=self.exits.changes,
        )  # fmt: skip
        #: The multiprocess folder's owner, shared with rank health and the render.
        self.folder = TrainerFolder(metrics_dir, retention=forget_after, clock=clock)
        self._files = TrainerFiles(metrics_dir, reader="rank watcher", folder=self.folder)
        self._interval = interval
        self._forget_after = forget_after
        self._clock = clock
        self._tracer = tracer or trace.NoOpTracer()
        self._lock = threading.Lock()  # guards the state below
        self._scan_lock = threading.Lock()  # one scan at a time
        self._stop = threading.Event()
        self._wake = threading.Event()  # an exit of a tracked rank: scan now
        self._alive_pids: frozenset[int] = frozenset()
        self.exits.on_exit(self._exited)
        self._thread: threading.Thread | None = None
        self._tracked: dict[RankKey, _Tracked] = {}
        self._unexpected: collections.Counter[RankKey] = collections.Counter()
        self._progress: dict[RankKey, float] = {}
        self._progress_seen: dict[RankKey, float] = {}
        self._steps: dict[RankKey, float] = {}
        self._last_scan_at: float | None = None
        self._last_error: str | None = None
        self._fault_signalled: set[int] = set()  # pids a fault of this agent signalled
        # (job, rank, reason) -> when the last such exit was noticed (Unix s)
        self._exit_times: dict[tuple[str, int, str], float] = {}
        # rank -> when its latest process was asked to stop (its stop marker's time)
        self._stop_requests: dict[RankKey, float] = {}

    def start(self) -> None:
        """Scan once now, then every ``interval`` seconds on a background thread."""
        if self._thread is not None:
            raise RuntimeError("RankWatcher already started")
        self._scan_logged()
        self._thread = threading.Thread(
            target=self._run, name="stormwatch-rank-watcher", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the background thread."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            self._scan_logged()

    def _exited(self, pid: int) -> None:
        """The exit source's listener (its thread): a tracked rank's exit starts a scan at
        once rather than at the next interval."""
        if pid in self._alive_pids:
            self._wake.set()

    def _scan_logged(self) -> None:
        try:
            self.scan()
        except Exception as exc:
            if self._last_error is None:
                log.warning("rank scan failed", exc_info=True)
            self._last_error = f"{type(exc).__name__}: {exc}"

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (on the scan thread) after a scan in which a rank appeared,
        exited, was replaced or was forgotten."""
        self._listeners.append(listener)

    @property
    def last_scan_at(self) -> float | None:
        """Unix time of the last completed scan."""
        return self._last_scan_at

    @property
    def last_error(self) -> str | None:
        """Why the last scan failed, or None when it succeeded."""
        return self._last_error

    def ranks(self) -> tuple[RankInfo, ...]:
        """Every rank known on this node, sorted by job and rank."""
        with self._lock:
            return tuple(self._info(key, t) for key, t in sorted(self._tracked.items()))

    def unexpected_exits(self) -> dict[RankKey, int]:
        """Unexpected exits per rank since the agent started (never forgotten)."""
        with self._lock:
            return dict(self._unexpected)

    def exit_counts(self) -> dict[tuple[str, int, str], int]:
        """Exits per ``(job, rank, reason)`` (:attr:`RankExit.reason`), never forgotten."""
        with self._lock:
            return dict(self._exit_counts)

    def last_exit_times(self) -> dict[tuple[str, int, str], float]:
        """When the last exit per ``(job, rank, reason)`` was noticed (Unix s), never
        forgotten: the rules order a job's failures against its stops by them."""
        with self._lock:
            return dict(self._exit_times)

    def stop_requests(self) -> dict[RankKey, float]:
        """When each rank's latest process was asked to stop (Unix s: the time of its
        ``rank<R>.stopping`` marker), never forgotten: the rules tell a stop's victims
        (failures after the job's first stop request) from the failure that made
        torchrun stop the others (it comes before their stop requests)."""
        with self._lock:
            return dict(self._stop_requests)

    def _note_stop_requests(self) -> None:
        """Record the stop markers the running ranks wrote since the last scan (one stat
        per running rank; under the lock)."""
        for key, tracked in self._tracked.items():
            known = self._stop_requests.get(key)
            if not tracked.alive or (known is not None and known >= tracked.create_time - 1.0):
                continue  # gone, or this process's request is recorded already
            stamp = self._marked_at(tracked, "stopping")
            if stamp is not None:
                self._stop_requests[key] = stamp

    def last_exit_codes(self) -> dict[RankKey, int]:
        """Last known exit code per rank still known (negative: the signal's number)."""
        with self._lock:
            return dict(self._last_exit_code)

    def last_progress(self) -> dict[RankKey, float]:
        """Last heartbeat per rank (Unix time), kept after the rank dies."""
        with self._lock:
            return dict(self._progress)

    def alive(self, rank: int, job: str | None = None) -> list[tuple[RankInfo, psutil.Process]]:
        """Running processes of ``rank`` (of ``job``, or of any job)."""
        with self._lock:
            return [
                (self._info(key, t), t.process)
                for key, t in sorted(self._tracked.items())
                if t.alive and key[1] == rank and (job is None or key[0] == job)
            ]

    def rank_of_pid(self, pid: int) -> RankKey | None:
        """The running rank that ``pid`` is, or descends from; None otherwise."""
        with self._lock:
            alive = {t.pid: (key, t.create_time) for key, t in self._tracked.items() if t.alive}
        try:
            process = psutil.Process(pid)
            chain = [process, *process.parents()]
        except (psutil.Error, OverflowError, ValueError):
            return None
        for candidate in chain:
            found = alive.get(candidate.pid)
            if found is not None and same_time(candidate.create_time(), found[1]):
                return found[0]
        return None

    def _info(self, key: RankKey, t: _Tracked) -> RankInfo:
        env = t.env
        return RankInfo(
            job=env.job,
            rank=env.rank,
            local_rank=env.local_rank,
            world_size=env.world_size,
            run_id=env.run_id,
            restart_count=env.restart_count,
            pid=t.pid,
            alive=t.alive,
            started_at=t.create_time,
            exited_at=t.exited_at,
            last_step=self._steps.get(key),
            last_progress_timestamp=self._progress.get(key),
            unexpected_exits=self._unexpected.get(key, 0),
        )

    def scan(self) -> None:
        """One scan (module docstring), thread-safe. Publishes what it noticed, failed or not:
        listeners, then ``on_exit`` per exit (``/metrics`` never behind the events, CI cc14)."""
        noticed: list[RankExit] = []
        changed = False
        try:
            changed = self._scan(noticed)
        finally:  # outside the locks
            calls: list[Callable[[], None]] = list(self._listeners) if changed or noticed else []
            for call in calls + [functools.partial(self._on_exit, e) for e in noticed]:
                try:
                    call()
                except Exception:
                    log.warning("rank watcher callback failed", exc_info=True)

    def _scan(self, noticed: list[RankExit]) -> bool:
        """:meth:`scan`'s work: exits go to ``noticed`` as counted; returns whether a rank
        appeared, exited, was replaced or was forgotten (raises on unexpected failures)."""
        with self._scan_lock:
            samples = self._files.read(
                LIVE_GAUGES, (HEARTBEAT_METRIC, PROGRESS_METRIC, STEP_METRIC)
            )
            table = self._finder.process_table()
            found, orphans = self._finder.discover_all(table)
            for orphan in orphans:  # still the job's rank (e.g. found after an agent restart)
                found.setdefault(orphan.env.key, orphan)
            now = self._clock()
            with self._lock:
                before = {key: (t.pid, t.alive) for key, t in self._tracked.items()}
                self._update(found, table, now, noticed)
                self._note_stop_requests()
                orphaned = self.orphaned.update(orphans, now)
                for beats in (samples[HEARTBEAT_METRIC], samples[PROGRESS_METRIC]):
                    for key, stamp in beats.items():
                        self._progress[key] = max(stamp, self._progress.get(key, stamp))
                        self._progress_seen[key] = now
                self._steps.update(samples[STEP_METRIC])
                self._forget(now)
            self._files.mark_dead(table)
            self.folder.maintain(Exited(table), self._instances())
            self._finder.forget_gone(table)
            with self._lock:
                self._alive_pids = frozenset(t.pid for t in self._tracked.values() if t.alive)
            self._last_scan_at = now
            self._last_error = None
        return orphaned or before != {key: (t.pid, t.alive) for key, t in self._tracked.items()}

    def _instances(self) -> dict[str, set[str]]:
        """Per job, the instances its running ranks carry (:attr:`RankEnv.instance`)."""
        with self._lock:
            found: dict[str, set[str]] = {}
            for key, tracked in self._tracked.items():
                if tracked.alive:
                    found.setdefault(key[0], set()).add(tracked.env.instance)
            return found

    def claims(
        self, environ: Mapping[str, str], cmdline: Sequence[str], cwd: str | None
    ) -> str | None:
        """Whether this node owns a rank with this environment, command line and
        working directory: None when it does, else why not (:meth:`RankFinder.claims`)."""
        return self._finder.claims(environ, cmdline, cwd)

    def check_owned(self, pid: int, create_time: float, key: RankKey) -> str | None:
        """Re-check, from fresh reads, that ``pid`` is still the claimed rank ``key``:
        None when it is, else why not, for a 404 (:meth:`RankFinder.check_owned`)."""
        return self._finder.check_owned(pid, create_time, key)

    def _update(
        self,
        found: Found,
        table: Mapping[int, ProcEntry],
        now: float,
        noticed: list[RankExit],
    ) -> None:
        """Track ``found``; appends each exit to ``noticed`` (the caller publishes them)."""
        for key, tracked in self._tracked.items():
            if not tracked.alive:
                continue
            current = table.get(tracked.pid)
            running = (
                current is not None
                and not current.zombie
                and same_time(current.create_time, tracked.create_time)
            )
            replaced = key in found and found[key][0].pid != tracked.pid
            if running and not replaced:
                continue
            zombie = current is not None and current.zombie
            code = exit_status(tracked.pid) if zombie else None
            if code is None:  # reaped already: the kernel told the proc connector
                # Ranks that were replaced may still run (no exit event): do not wait.
                gone = self.exits.lookup(
                    tracked.pid,
                    since=tracked.create_time - 1.0,
                    wait=0.0 if current is not None and not zombie else EXIT_EVENT_WAIT,
                )
                code = gone.returncode if gone is not None else None
            tracked.alive = False
            tracked.exited_at = now
            # A done marker with a known failure (a job's sys.exit(3) passes the API's
            # clean shutdown at exit) is not a finish.
            clean = (self._marked_at(tracked, "done") is not None) and code in (None, 0)
            asked = self._marked_at(tracked, "stopping")  # also a fault's SIGTERM
            if asked is not None:
                self._stop_requests[key] = asked
            stopped = not clean and tracked.pid not in self._fault_signalled
            stopped = stopped and is_stop(asked, code, key[0], self._progress)
            self._fault_signalled.discard(tracked.pid)
            if clean:
                log.info("rank %s of job %s (pid %d) finished", key[1], key[0], tracked.pid)
            elif stopped:
                msg = "rank %s of job %s (pid %d) stopped on request (SIGTERM), status %s"
                log.info(msg, *reversed(key), tracked.pid, code)
            else:
                self._unexpected[key] += 1
                msg = "rank %s of job %s (pid %d) exited unexpectedly"
                log.warning(msg, *reversed(key), tracked.pid)
            gone_rank = RankExit(key[0], key[1], tracked.pid, clean, replaced, code, stopped)
            self._exit_counts[(key[0], key[1], gone_rank.reason)] += 1
            self._exit_times[(key[0], key[1], gone_rank.reason)] = now
            if code is not None:
                self._last_exit_code[key] = code
            noticed.append(gone_rank)
            attributes = exit_attributes(tracked.env, tracked.pid, clean, replaced, code)
            self._tracer.start_span("rank.exit", attributes=attributes).end()
        for key, (proc, env) in found.items():
            known = self._tracked.get(key)
            if known is not None and known.alive and known.pid == proc.pid:
                continue
            try:
                process = psutil.Process(proc.pid)
            except psutil.Error:
                continue
            self._tracked[key] = _Tracked(env, process, proc.pid, proc.create_time)
            self._unexpected.setdefault(key, 0)
            log.info("rank %d of job %s is pid %d", env.rank, env.job, proc.pid)

    def note_fault_signal(self, pid: int, *, sent: bool = True) -> None:
        """A fault of this agent is about to signal ``pid`` (``kill_rank``): its exit is a
        failure even when the rank takes the signal for a stop request (SIGTERM).
        ``sent=False``: the signal could not be sent after all (forget the note)."""
        with self._lock:
            if sent:
                self._fault_signalled.add(pid)
            else:
                self._fault_signalled.discard(pid)

    def _marked_at(self, tracked: _Tracked, what: str) -> float | None:
        return marker_time(
            self._dir, tracked.env.rank, what, pid=tracked.pid, create_time=tracked.create_time
        )

    def _forget(self, now: float) -> None:
        for key, tracked in list(self._tracked.items()):
            if tracked.alive or tracked.exited_at is None:
                continue
            clean = self._marked_at(tracked, "done") is not None
            if clean or now - tracked.exited_at >= self._forget_after:
                del self._tracked[key]
                self._last_exit_code.pop(key, None)
                self._progress.pop(key, None)
                self._steps.pop(key, None)
        # Heartbeats of ranks never seen running (e.g. files left from before an
        # agent restart) go once no file has refreshed them for forget_after.
        for key, seen in list(self._progress_seen.items()):
            if key not in self._tracked and (
                key not in self._progress or now - seen >= self._forget_after
            ):
                self._progress.pop(key, None)
                self._steps.pop(key, None)
                del self._progress_seen[key]


# fmt: off
__all__ = ["RankExit", "RankInfo", "RankKey", "RankWatcher", "is_rank_launcher",
           "is_torchrun_agent"]
