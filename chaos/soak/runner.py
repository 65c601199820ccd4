"""``stormwatch chaos soak``: one fault-free job on the lab, disturbed only as operators and
schedulers disturb jobs every day, and every alert that fired meanwhile.

The soak (settings and schedule: :mod:`.settings`; the job and its lab: :mod:`.job`):

1. starts the job (elastic, checkpoints every ``checkpoint_every`` steps, an evaluation
   pause of ``eval_seconds`` every ``eval_every`` steps) and waits for its first step;
2. **planned restart** at T/3, once a checkpoint exists: the whole job is stopped (SIGTERM
   to every torchrun and worker, SIGKILL after the lab's grace period) and started again
   under the same name, and must resume from its last checkpoint;
3. **elastic resize** at 2T/3, once it has checkpointed since that resume: one node (the
   job's last) leaves (SIGTERM to its torchrun), the job must restart at the smaller world
   size; ``rejoin_after`` later the node's torchrun is started again and the job must grow
   back to its full size;
4. **end** at T, once the grown job has made a step: the job is stopped;
5. waits ``settle_seconds``, then counts, from Prometheus, every alert that fired (and every
   alert only pending) from the soak's start to then (:mod:`.counting`), placing each
   against the soak's events: the ones above, each checkpoint (rank 0's log) and each
   evaluation pause (the job's ``eval`` phase gauge).

Each stage waits for the one before it at most ``wait_seconds``; a stage that does not
happen, or a job that ends by itself, is a problem in the report (the job is stopped and
the alerts counted anyway). SIGINT/SIGTERM stop the job, count what there is, and mark the
report interrupted. Every event goes to the reporter with its wall time as it happens.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.execution.reporter import NullReporter, Reporter
from stormwatch.chaos.gameday.suite import interrupts_raise
from stormwatch.chaos.soak.counting import count_alerts, phase_passes, query_window
from stormwatch.chaos.soak.job import RankZeroLog, SoakLab, soak_job_spec, whole_minutes
from stormwatch.chaos.soak.report import EventKind, SoakEvent, SoakReport, write_report
from stormwatch.chaos.soak.settings import SoakSettings
from stormwatch.clients.prometheus import promql_string
from stormwatch.errors import StormwatchError
from stormwatch.telemetry.events import StartEvent

#: Seconds between two looks at the job's rank-0 log.
POLL_SECONDS = 1.0


def new_soak_id(now: float | None = None) -> str:
    """``20250101T120000-soak-1a2b``: sortable by start time."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-soak-{secrets.token_hex(2)}"


def job_name_of(soak_id: str) -> str:
    """The job's name: the soak id, lowercase (``soak-20250101t120000-1a2b``)."""
    stamp, _, suffix = soak_id.partition("-soak-")
    return re.sub(r"[^a-z0-9-]", "-", f"soak-{stamp}-{suffix}".lower())


@dataclass
class SoakClock:
    """Wall time (events), a monotonic clock (waits) and sleep; tests pass a stand-in."""

    wall: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


@dataclass
class _Progress:
    """What the soak has seen so far, for the next stage's conditions."""

    resumed_at: float | None = None
    grown_at: float | None = None
    full_world_size: int | None = None
    notes: list[str] = field(default_factory=list)


class SoakRunner:
    """Runs one soak (module docstring) and builds its :class:`SoakReport`.

    Args:
        settings: the plan.
        lab: the lab the job runs on.
        soak_id: the soak's id (default: a new one); the job is named after it.
        reporter: progress output (each event as it happens).
        clock: the clocks and sleep (tests).
    """

    def __init__(
        self,
        settings: SoakSettings,
        lab: SoakLab,
        *,
        soak_id: str | None = None,
        reporter: Reporter | None = None,
        clock: SoakClock | None = None,
    ) -> None:
        self.settings = settings
        self.lab = lab
        self.soak_id = soak_id or new_soak_id()
        self.job = job_name_of(self.soak_id)
        self.folder = lab.run_dir / "soaks" / self.soak_id
        self.reporter = reporter or NullReporter()
        self._clock = clock or SoakClock()
        self._spec = soak_job_spec(self.job, settings)
        self._log: RankZeroLog | None = None
        self._seen = _Progress()
        now = self._clock.wall()
        self._t0 = self._clock.monotonic()
        self.report = SoakReport(
            soak_id=self.soak_id,
            run_dir=str(lab.run_dir),
            job=self.job,
            settings=settings,
            started_at=now,
            window_start=now,
            evaluation_interval_seconds=lab.evaluation_interval,
        )

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> SoakReport:
        """Run the soak; returns the report (counted, not yet written: :meth:`save`)."""
        running = False
        try:
            with interrupts_raise():
                running = True
                self._drive()
                running = False
                self._settle()
        except KeyboardInterrupt:
            self.report.interrupted = True
            self.reporter.event("interrupted: the job is stopped and the alerts counted so far")
        except ChaosError as exc:  # a stage did not happen, or the lab refused an action
            self.report.problems.append(str(exc))
            self.reporter.event(f"soak problem: {exc}")
        if running:
            self._stop_after_problem()
            if not self.report.interrupted:  # the stop's alerts land in the window too
                try:
                    with interrupts_raise():
                        self._settle()
                except KeyboardInterrupt:
                    self.report.interrupted = True
        self.report.ended_at = self._clock.wall()
        self._count()
        return self.report

    def _drive(self) -> None:
        self._start()
        self._restart()
        self._resize()
        self._end()

    def _start(self) -> None:
        self._event("start", f"job {self.job} started (elastic, {self._shape()})")
        log_dir = self.lab.start(self._spec)
        self._log = RankZeroLog(log_dir / "rank0.jsonl")
        first = self._wait("the job's first step", lambda log: log.last_step is not None)
        self._seen.full_world_size = first.world_size
        at = first.last_step.time if first.last_step is not None else None
        self._event("start", f"first step done at world size {first.world_size}", at=at)

    def _restart(self) -> None:
        self._until(self.settings.restart_at, "the planned restart", self._has_checkpoint(0.0))
        step = self._current_step()
        self._event(
            "restart",
            "planned restart: SIGTERM to every torchrun and worker of the job "
            f"(as `stormwatch lab stop` or Slurm's scancel), at step {step}",
            step=step,
        )
        self.lab.stop(self.job)
        stopped = self._clock.wall() - self.report.events[-1].at
        resubmitted = self._event(
            "restart", f"stopped in {stopped:.1f} s; the same job submitted again"
        )
        self.lab.start(self._spec)
        start = self._wait_start("the restarted job's resume", resubmitted.at, lambda s: True)
        if start.resumed_from_step is None:
            raise ChaosError("the planned restart started afresh instead of resuming a checkpoint")
        self._seen.resumed_at = start.time
        self._event(
            "restart",
            f"resumed from the checkpoint of step {start.resumed_from_step} at world size "
            f"{start.world_size}",
            at=start.time,
            step=start.resumed_from_step,
        )

    def _resize(self) -> None:
        resumed = self._seen.resumed_at or 0.0
        self._until(self.settings.resize_at, "the resize", self._has_checkpoint(resumed))
        node = self._leave_node()
        full = self._full_size()
        left = self._event("resize", f"{node} leaves the job: SIGTERM to its torchrun")
        code = self.lab.leave(self.job, node)
        took = self._clock.wall() - left.at
        self._event("resize", f"{node} left in {took:.1f} s (its torchrun's exit status {code})")
        start = self._wait_start(
            f"the job to restart without {node}", left.at, lambda s: (s.world_size or full) < full
        )
        self._event(
            "resize",
            f"shrunk to world size {start.world_size}, resumed from step {start.resumed_from_step}",
            at=start.time,
            step=start.resumed_from_step,
        )
        self._hold(self.settings.rejoin_after, f"{node} rejoins")
        rejoined = self._event("resize", f"{node} rejoins: its torchrun started again")
        self.lab.rejoin(self.job, node)
        start = self._wait_start(
            f"the job to grow back with {node}", rejoined.at, lambda s: s.world_size == full
        )
        self._seen.grown_at = start.time
        self._event(
            "resize",
            f"grown back to world size {full}, resumed from step {start.resumed_from_step}",
            at=start.time,
            step=start.resumed_from_step,
        )

    def _end(self) -> None:
        grown = self._seen.grown_at or 0.0
        self._until(1.0, "the end", lambda log: log.step_after(grown))
        step = self._current_step()
        self._event("end", f"end of the soak: the job is stopped at step {step}", step=step)
        self.lab.stop(self.job)

    def _settle(self) -> None:
        self._hold(self.settings.settle_seconds, "the count", watch_job=False)

    def _stop_after_problem(self) -> None:
        """Stop the job after a problem or an interrupt (a failed stop is one more problem)."""
        try:
            if not self.lab.ended(self.job):
                self._event("end", "the soak stopped early: the job is stopped")
                self.lab.stop(self.job)
        except (ChaosError, KeyboardInterrupt) as exc:
            self.report.problems.append(f"could not stop the job: {exc}")

    # -- waiting ------------------------------------------------------------------------------

    def _wait(self, what: str, ready: Callable[[RankZeroLog], bool]) -> RankZeroLog:
        """Poll the rank-0 log until ``ready``; at most ``wait_seconds``.

        Raises:
            ChaosError: it did not happen in time, or the job ended meanwhile.
        """
        deadline = self._clock.monotonic() + self.settings.wait_seconds
        log = self._rank_zero()
        while True:
            log.poll()
            if ready(log):
                return log
            if self._clock.monotonic() > deadline:
                raise ChaosError(
                    f"{what} did not happen within {whole_minutes(self.settings.wait_seconds)} "
                    f"(last step {log.step}); see the job's logs in {log.path.parent}"
                )
            self._check_running(what)
            self.reporter.status(f"waiting for {what}: step {log.step}, world {log.world_size}")
            self._clock.sleep(POLL_SECONDS)

    def _wait_start(
        self, what: str, after: float, wanted: Callable[[StartEvent], bool]
    ) -> StartEvent:
        """The first start of the workers logged after ``after`` that is ``wanted`` (waited
        for as :meth:`_wait` does)."""

        def found(log: RankZeroLog) -> StartEvent | None:
            return next((s for s in log.starts if s.time > after and wanted(s)), None)

        start = found(self._wait(what, lambda log: found(log) is not None))
        assert start is not None  # the wait returned on it
        return start

    def _until(self, fraction: float, what: str, ready: Callable[[RankZeroLog], bool]) -> None:
        """Train until ``fraction`` of the soak has passed and ``ready`` holds (at most
        ``wait_seconds`` past that time)."""
        at = self._t0 + fraction * self.settings.seconds
        self._hold(at - self._clock.monotonic(), what)
        self._wait(what, ready)

    def _hold(self, seconds: float, what: str, *, watch_job: bool = True) -> None:
        """Let ``seconds`` pass (the job training), watching that it still runs."""
        until = self._clock.monotonic() + seconds
        while (left := until - self._clock.monotonic()) > 0:
            if watch_job:
                self._check_running(what)
                self._rank_zero().poll()
            log = self._log
            at = f"step {log.step}, world {log.world_size}; " if log and watch_job else ""
            self.reporter.status(f"{at}{what} in {whole_minutes(left)}")
            self._clock.sleep(min(POLL_SECONDS, left))

    def _check_running(self, what: str) -> None:
        if self.lab.ended(self.job):
            raise ChaosError(f"the job ended by itself while the soak waited for {what}")

    def _has_checkpoint(self, after: float) -> Callable[[RankZeroLog], bool]:
        return lambda log: log.checkpoint_after(after) is not None

    # -- helpers ------------------------------------------------------------------------------

    def _rank_zero(self) -> RankZeroLog:
        if self._log is None:
            raise ChaosError("the job has not started")
        return self._log

    def _current_step(self) -> int | None:
        log = self._rank_zero()
        log.poll()
        return log.step

    def _full_size(self) -> int:
        log = self._rank_zero()
        return log.world_size or self._seen.full_world_size or 0

    def _leave_node(self) -> str:
        nodes = self.lab.nodes(self.job)
        node = self.settings.leave_node or nodes[-1]
        if len(nodes) < 2 or node == nodes[0]:
            raise ChaosError(
                f"the resize needs a node other than the rendezvous host {nodes[0]} to leave "
                f"(job nodes: {', '.join(nodes)}); bring up a lab of two nodes or more"
            )
        return node

    def _shape(self) -> str:
        s = self.settings
        evals = (
            f"an evaluation pause of {s.eval_seconds:g} s every {s.eval_every} steps"
            if s.eval_every
            else "no evaluation"
        )
        return (
            f"a checkpoint every {s.checkpoint_every} steps, {evals}, {s.step_delay:g} s/step sleep"
        )

    def _event(
        self, kind: EventKind, detail: str, *, at: float | None = None, step: int | None = None
    ) -> SoakEvent:
        event = SoakEvent(
            kind=kind, at=self._clock.wall() if at is None else at, detail=detail, step=step
        )
        self.report.events.append(event)
        utc = time.strftime("%H:%M:%S", time.gmtime(event.at))
        self.reporter.event(f"{utc} (t+{event.at - self.report.started_at:.0f} s) {kind}: {detail}")
        return event

    # -- counting -----------------------------------------------------------------------------

    def _count(self) -> None:
        """Fill the report: the job's starts, checkpoints and evaluation pauses, and every
        alert of the window (a failed query is a problem, the rest is kept)."""
        report = self.report
        report.window_end = self._clock.wall()
        if self._log is not None:
            self._log.poll()
            report.world_sizes = [s.world_size or 0 for s in self._log.starts]
            report.resumed_from = [s.resumed_from_step for s in self._log.starts]
            report.events += [
                SoakEvent(kind="checkpoint", at=c.time, detail=f"step {c.step}", step=c.step)
                for c in self._log.checkpoints
            ]
        step = report.evaluation_interval_seconds
        window = {"start": report.window_start, "end": report.window_end, "step": step}
        prometheus = self.lab.prometheus
        try:
            phase = (
                "max(stormwatch_train_phase_deadline_timestamp_seconds{training_job="
                f'{promql_string(self.job)}, phase="eval"}}) > 0'
            )
            for first, last in phase_passes(query_window(prometheus, phase, **window), step):
                report.events.append(
                    SoakEvent(
                        kind="eval", at=first, detail="evaluation pause", seconds=last - first
                    )
                )
            firing = query_window(prometheus, 'ALERTS{alertstate="firing"}', **window)
            pending = query_window(prometheus, 'ALERTS{alertstate="pending"}', **window)
        except StormwatchError as exc:
            report.problems.append(f"could not read the alerts from Prometheus: {exc}")
            return
        report.events.sort(key=lambda e: e.at)
        report.fired, report.pending_only = count_alerts(
            firing, pending, report.events, step=step, window_start=report.window_start
        )

    def save(self) -> tuple[Path, Path]:
        """Write ``soak.md`` and ``soak.json`` to :attr:`folder`; returns their paths."""
        return write_report(self.report, self.folder)


__all__ = ["POLL_SECONDS", "SoakClock", "SoakRunner", "job_name_of", "new_soak_id"]
