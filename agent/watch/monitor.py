"""The rank-health monitor: drives the detectors of :mod:`.health` from live data.

Every ``interval`` seconds (the rank watcher's, 1 s) on its own thread:

1. reads the per-step gauges (``stormwatch_train_step``,
   ``stormwatch_train_step_compute_seconds``,
   ``stormwatch_train_step_collective_wait_seconds``), the step heartbeat and the
   phase deadlines (``stormwatch_train_phase_deadline_timestamp_seconds``; a rank's
   phase is the one with the latest deadline, which names its hang) from the
   ``gauge_live*`` multiprocess files and
   ``stormwatch_collective_calls_total`` from the ``counter_*`` files of the metrics dir;
2. feeds the :class:`~.health.HangDetector` with the rank watcher's running
   ranks and heartbeats (the later of step and progress heartbeats) and their phase
   deadlines, and the :class:`~.health.StragglerDetector` with the running ranks'
   step gauges;
3. records every transition in the :class:`~.events.EventLog`; on a hang it
   writes diagnostics for the job's running ranks (:mod:`.diagnostics`) on a
   separate thread, so a slow ``py-spy`` never delays detection; on the first hang of
   a job (until none of its ranks is hung) that thread also asks the job's ranks for
   their flight recorders and records the culprit they name, ``rank_hang_culprit``
   (:mod:`.hangdumps`).

Exports (through the ``ranks`` collector): ``stormwatch_rank_hung``,
``stormwatch_rank_hangs_total``, ``stormwatch_rank_collective_lag``,
``stormwatch_rank_straggler_score``, ``stormwatch_rank_straggler``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from stormwatch.agent.watch import diagnostics, hangdumps
from stormwatch.agent.watch.detectors import (
    HANG,
    HangDetector,
    HangSettings,
    RankProgress,
    StepSample,
    StragglerDetector,
    StragglerSettings,
    collective_lag,
)
from stormwatch.agent.watch.events import EventLog
from stormwatch.agent.watch.procs import process_cwd
from stormwatch.agent.watch.ranks import RankInfo, RankWatcher
from stormwatch.agent.watch.trainer_files import (
    CALLS_SAMPLE,
    COMPUTE_METRIC,
    COUNTERS,
    HEARTBEAT_METRIC,
    LIVE_GAUGES,
    PHASE_DEADLINE_METRIC,
    PROGRESS_METRIC,
    STEP_METRIC,
    WAIT_METRIC,
    TrainerFiles,
    add,
)
from stormwatch.contracts.rank_env import RankKey

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class HealthView:
    """What the collector exports (all keyed by ``(job, rank)``)."""

    hung: dict[RankKey, bool]
    hangs: dict[RankKey, int]
    stall_threshold: dict[RankKey, float]
    lag: dict[RankKey, float]
    straggler_score: dict[RankKey, float]
    straggler: dict[RankKey, bool]


class RankHealth:
    """Hang and straggler detection for the ranks the watcher tracks.

    Args:
        watcher: the rank watcher (running ranks, heartbeats).
        metrics_dir: the trainer's multiprocess folder.
        events: where transitions are recorded.
        diagnostics_dir: ``<state-dir>/diagnostics``.
        hang, straggler: detector settings (defaults: see :mod:`.health`).
        interval: seconds between evaluations.
        clock: Unix time.
    """

    def __init__(
        self,
        watcher: RankWatcher,
        metrics_dir: Path,
        events: EventLog,
        diagnostics_dir: Path,
        *,
        hang: HangSettings | None = None,
        straggler: StragglerSettings | None = None,
        interval: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._watcher = watcher
        # The watcher's folder: one lock and one accumulator for every reader.
        self._files = TrainerFiles(metrics_dir, reader="rank health", folder=watcher.folder)
        self._events = events
        self._diag_dir = Path(diagnostics_dir)
        self._hang = HangDetector(hang)
        self._straggler = StragglerDetector(straggler)
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._workers: list[threading.Thread] = []
        self._culprit_asked: set[str] = set()  # jobs hung now whose ranks were asked for dumps
        self._view = HealthView({}, {}, {}, {}, {}, {})
        self.last_error: str | None = None

    def start(self) -> None:
        """Evaluate every ``interval`` seconds on a background thread."""
        self._thread = threading.Thread(
            target=self._run, name="stormwatch-rank-health", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; wait (bounded) for diagnostics being written."""
        self._stop.set()
        for thread in [self._thread, *self._workers]:
            if thread is not None:
                thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.evaluate()
                self.last_error = None
            except Exception as exc:
                if self.last_error is None:
                    log.warning("rank health evaluation failed", exc_info=True)
                self.last_error = f"{type(exc).__name__}: {exc}"

    def view(self) -> HealthView:
        """The latest evaluation."""
        with self._lock:
            return self._view

    def evaluate(self) -> None:
        """One evaluation (see the module docstring)."""
        gauges, calls, phases = self._read()
        ranks = self._watcher.ranks()
        progress = self._watcher.last_progress()
        running = {(r.job, r.rank): r for r in ranks if r.alive}
        now = self._clock()
        # step and step heartbeat from one read (a step time pairs them); a dead rank's
        # gauges are gone: the watcher's last step then
        steps, beats = gauges[STEP_METRIC], gauges[HEARTBEAT_METRIC]
        # read with the phases: the watcher's heartbeat is up to a scan old, and a rank that
        # just left a phase (its deadline 0 now) must not look silent since before it
        fresh = gauges[PROGRESS_METRIC]
        hang_input = [
            RankProgress(
                key,
                r.alive,
                _latest(progress.get(key), beats.get(key), fresh.get(key)),
                steps[key] if key in beats and key in steps else r.last_step,
                step_heartbeat=beats.get(key),
                paused_until=phases.get(key, (None, 0.0))[1],
                phase=phases.get(key, (None, 0.0))[0],
                started_at=r.started_at if r.alive else None,
            )
            for r in ranks
            for key in [(r.job, r.rank)]
        ]
        samples = [
            StepSample(key, step, gauges[COMPUTE_METRIC][key], gauges[WAIT_METRIC].get(key, 0.0))
            for key, step in gauges[STEP_METRIC].items()
            if key in running and key in gauges[COMPUTE_METRIC]
        ]
        mine = {key: n for key, n in calls.items() if key in running}
        lag = collective_lag(mine)
        transitions = self._hang.observe(now, hang_input) + self._straggler.observe(samples)
        hung_now = self._hang.hung()
        self._culprit_asked &= {key[0] for key, hung in hung_now.items() if hung}
        for t in transitions:
            info = running.get(t.key)
            details = dict(t.details)
            if t.kind == HANG:
                details["collective_calls"] = mine.get(t.key)
                details["collective_lag"] = lag.get(t.key)
                job_lag = [(v, k[1]) for k, v in lag.items() if k[0] == t.key[0]]
                most = max(job_lag, default=(0.0, None))
                details["behind_rank"] = most[1] if most[0] > 0 else None
                details["diagnostics"] = str(
                    self._diagnose(t.key[0], running, hung_now, mine, lag, now)
                )
            self._events.record(
                t.kind, t.key[0], t.key[1], pid=info.pid if info else None, **details
            )
        view = HealthView(
            hung={k: v for k, v in hung_now.items() if k in running},
            hangs=self._hang.episodes(),
            stall_threshold={k: v for k, v in self._hang.thresholds().items() if k in running},
            lag=lag,
            straggler_score=self._straggler.scores(),
            straggler=self._straggler.flagged(),
        )
        with self._lock:
            self._view = view

    def _diagnose(
        self,
        job: str,
        running: dict[RankKey, RankInfo],
        hung: dict[RankKey, bool],
        calls: dict[RankKey, float],
        lag: dict[RankKey, float],
        now: float,
    ) -> Path:
        stamp_folder = self._diag_dir
        targets: list[diagnostics.RankTarget] = []
        for key, info in sorted(running.items()):
            if key[0] != job:
                continue
            pid = info.pid
            try:
                cmdline = tuple(psutil.Process(pid).cmdline())
            except psutil.Error:
                cmdline = ()
            targets.append(
                diagnostics.RankTarget(key, pid, cmdline, process_cwd(pid), _environ(pid))
            )
        job_calls = {k: v for k, v in calls.items() if k[0] == job}
        job_lag = {k: v for k, v in lag.items() if k[0] == job}
        hung_ranks = [k[1] for k, v in hung.items() if v and k[0] == job]
        ask = job not in self._culprit_asked  # once per hang of the job
        self._culprit_asked.add(job)
        folder = diagnostics.folder_for(stamp_folder, job, now)

        def work() -> None:
            found = None
            if ask:
                reason = f"hang of job {job} (ranks {hung_ranks})"
                found = hangdumps.diagnose(targets, reason=reason, now=now)
            culprit = None if found is None else found.culprit
            diagnostics.collect(
                stamp_folder,
                job,
                targets,
                hung=hung_ranks,
                calls=job_calls,
                lag=job_lag,
                now=now,
                culprit=culprit,
            )
            if found is not None and culprit is not None and culprit.rank is not None:
                self._record_culprit(job, found, running, folder)

        thread = threading.Thread(target=work, name="stormwatch-hang-diagnostics", daemon=True)
        thread.start()
        self._workers = [t for t in self._workers if t.is_alive()] + [thread]
        return folder

    def _record_culprit(
        self,
        job: str,
        found: hangdumps.HangCulprit,
        running: dict[RankKey, RankInfo],
        folder: Path,
    ) -> None:
        culprit = found.culprit
        assert culprit is not None and culprit.rank is not None
        info = running.get((job, culprit.rank))
        self._events.record(
            "rank_hang_culprit",
            job,
            culprit.rank,
            pid=info.pid if info else None,
            method=culprit.method,
            certain=culprit.certain,
            evidence=culprit.evidence,
            asked=list(found.asked),
            answered=list(found.answered),
            diagnostics=str(folder),
        )

    def _read(
        self,
    ) -> tuple[
        dict[str, dict[RankKey, float]], dict[RankKey, float], dict[RankKey, tuple[str, float]]
    ]:
        """The per-step gauges and heartbeat, the collective calls, and per rank the phase
        it is in with its deadline (the latest non-zero deadline)."""
        gauges = self._files.read(
            LIVE_GAUGES,
            (STEP_METRIC, COMPUTE_METRIC, WAIT_METRIC, HEARTBEAT_METRIC, PROGRESS_METRIC),
        )
        calls = self._files.read(COUNTERS, (CALLS_SAMPLE,), combine=add)[CALLS_SAMPLE]
        deadlines = self._files.read_by_label(LIVE_GAUGES, PHASE_DEADLINE_METRIC, "phase")
        phases = {}
        for key, by_phase in deadlines.items():
            inside = [(deadline, phase) for phase, deadline in by_phase.items() if deadline > 0]
            if inside:  # 0: left that phase
                deadline, phase = max(inside)
                phases[key] = (phase, deadline)
        return gauges, calls, phases


def _latest(*beats: float | None) -> float | None:
    """The latest of the heartbeats known (``None`` when none is)."""
    known = [b for b in beats if b is not None]
    return max(known) if known else None


def _environ(pid: int) -> dict[str, str]:
    """The environment of ``pid`` (empty when it cannot be read: then only its command
    line says where its dumps go)."""
    try:
        return dict(psutil.Process(pid).environ())
    except psutil.Error:
        return {}


__all__ = ["HealthView", "RankHealth"]
