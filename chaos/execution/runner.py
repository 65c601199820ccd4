"""Run an experiment: pre-flight, steady state before, method, steady state after, rollbacks.

Order (chaostoolkit's, plus the ledger's guarantees, FC-13):

1. pre-flight: the services the experiment needs answer (nothing written yet);
2. recovery: open faults of dead controllers in the ledger are reverted;
3. the job is started on the lab (or attached with ``--job``) and warmed up
   (every rank completed a step);
4. steady-state hypothesis *before*; the method runs only if it held;
5. method: actions wait for ``when.step`` (rank logs), locate the rank, write
   the fault to the ledger, *then* send it; probes wait for their condition;
6. steady-state hypothesis *after*;
7. rollbacks, per ``rollback_strategy`` (default ``always``: also after a
   deviation, a failure and an abort);
8. cleanup: every fault of this experiment still open in the ledger is
   reverted, whatever happened.

SIGINT/SIGTERM (via :func:`run_experiment`) cancel the run: injection stops,
steps 7-8 still run, the journal is written, the status is ``aborted``.
The journal is rewritten after every activity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import ChaosError, FaultError
from stormwatch.chaos.execution.ids import job_name_for, new_experiment_id
from stormwatch.chaos.execution.journal import ExperimentStatus, JobRef, Journal, Phase
from stormwatch.chaos.execution.journal_writer import JournalWriter
from stormwatch.chaos.execution.method import MethodMixin
from stormwatch.chaos.execution.probes import ProbeContext, ProbeOutcome, wait_for
from stormwatch.chaos.execution.readiness import preflight, wait_until_stepping
from stormwatch.chaos.execution.reporter import NullReporter, Reporter
from stormwatch.chaos.execution.rollback import RollbackMixin, _uncancel
from stormwatch.chaos.execution.tracing import ExperimentTrace
from stormwatch.chaos.experiment.model import (
    Experiment,
    JobProvider,
    Provider,
)
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.chaos.ledger.revert import RevertOutcome, revert_entries
from stormwatch.chaos.target import Target
from stormwatch.dashboards.annotations import Annotator
from stormwatch.lab import AsyncPrometheusClient
from stormwatch.trainer.telemetry.ranklogs import read_job_logs

logger = logging.getLogger(__name__)

#: Exit statuses of a run: 0 success, 1 deviated/failed/rollback failure, 130 aborted.
EXIT_OK, EXIT_FAILED, EXIT_ABORTED = 0, 1, 130


@dataclass(frozen=True, kw_only=True)
class RunnerConfig:
    """How to run one experiment.

    Attributes:
        attach_job: attach to this running job instead of starting the experiment's job.
        experiment_id: the id (and folder name); generated (``<utc time>-<title>-<hex>``) when None.
        step_poll_seconds: how often rank logs are read while waiting for a step (0.2 s:
            steps take ~0.3 s in the demo, so the fault lands within one step).
        recovery_timeout_seconds: how long the after-phase waits for every rank to complete
            a step after a self-reverting fault (kill_rank) before it says "not recovered".
        job_end_timeout_seconds: how long :meth:`Runner.run` waits, at the end, for a job it
            started to end (torchrun shuts down for ~30 s after the last step); a job that
            is still running then is stopped.
    """

    attach_job: str | None = None
    experiment_id: str | None = None
    step_poll_seconds: float = 0.2
    recovery_timeout_seconds: float = 300.0
    job_end_timeout_seconds: float = 180.0


@dataclass(frozen=True)
class ExperimentRun:
    """The result: the journal, where it was written, and the exit status to use."""

    journal: Journal
    journal_path: Path
    exit_code: int


class Runner(MethodMixin, RollbackMixin):
    """Runs one validated experiment against a target.

    Args:
        experiment: the validated experiment.
        source: the file it came from (copied next to the journal).
        target: what it runs against.
        config: run options.
        reporter: progress output (default: none).
        annotator: Grafana annotations of the experiment's start/end and each fault
            injected and reverted (default :meth:`Annotator.from_env`: off unless
            ``STORMWATCH_GRAFANA_URL`` is set); closed at the end of :meth:`run`.
    """

    def __init__(
        self,
        experiment: Experiment,
        *,
        source: Path,
        target: Target,
        config: RunnerConfig | None = None,
        reporter: Reporter | None = None,
        annotator: Annotator | None = None,
    ) -> None:
        self.experiment = experiment
        self.annotator = annotator if annotator is not None else Annotator.from_env()
        self.source = Path(source)
        self.target = target
        self.config = config or RunnerConfig()
        self.reporter: Reporter = reporter or NullReporter()
        self.experiment_id = self.config.experiment_id or new_experiment_id(experiment.title)
        self.experiment_dir = Path(target.run_dir) / "experiments" / self.experiment_id
        self.journal_path = self.experiment_dir / "journal.json"
        self._last_fault_at: float | None = None
        self._first_seen_steps: dict[int, int] = {}
        self._self_reverting_faults: list[str] = []
        self._job: JobRef | None = None
        self._prometheus: AsyncPrometheusClient | None = None
        self._agents: AgentClient | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ledger: Ledger | None = None
        journal = Journal(
            experiment_id=self.experiment_id,
            title=experiment.title,
            file=self.source,
            experiment=experiment.model_dump(mode="json"),
            started_at=time.time(),
        )
        self._trace = ExperimentTrace(self.experiment_id, experiment.title)
        self._writer = JournalWriter(journal, self.journal_path, self._trace)

    @property
    def journal(self) -> Journal:
        """The journal so far (complete once :meth:`run` returned)."""
        return self._writer.journal

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> ExperimentRun:
        """Run the experiment; never raises for what the experiment does (see the journal).

        Raises:
            LabNotReady: pre-flight failed (nothing was started or written).
        """
        async with aiohttp.ClientSession() as session:
            self._session = session
            self._agents = AgentClient(session)
            if self.target.prometheus_url:
                self._prometheus = AsyncPrometheusClient(
                    self.target.prometheus_url, session=session
                )
            assert self._agents is not None
            await preflight(
                self.experiment, self.target, prometheus=self._prometheus, agents=self._agents
            )
            self._ledger = Ledger(ledger_path(self.target.run_dir))
            self.experiment_dir.mkdir(parents=True, exist_ok=True)
            self._trace.export_to(self.experiment_dir)
            with contextlib.suppress(OSError):
                shutil.copyfile(self.source, self.experiment_dir / "experiment.yaml")
            self._writer.save()
            self._annotate(f"experiment {self.experiment_id} started", "experiment-started")
            status: ExperimentStatus = "failed"
            try:
                status = await self._body()
            except asyncio.CancelledError:
                _uncancel()
                status = "aborted"
                self.journal.error = "interrupted: injection stopped; faults reverted"
                self.reporter.event("interrupted: stopping injection, reverting faults")
            except ChaosError as exc:
                status = "failed"
                self.journal.error = str(exc)
                self.reporter.event(f"failed: {exc}")
            except Exception as exc:  # a foreign error or a bug: still roll back (FC-13)
                logger.exception("experiment %s failed unexpectedly", self.experiment_id)
                status = "failed"
                self.journal.error = f"unexpected {type(exc).__name__}: {exc}"
                self.reporter.event(f"failed: {self.journal.error}")
            self.journal.status = status
            self._writer.save()
            rollbacks_ok = await self._rollbacks(status)
            cleanup_ok = await self._cleanup(status)
            self.journal.rollbacks_ok = rollbacks_ok and cleanup_ok
            self.journal.faults = self._ledger.entries(experiment_id=self.experiment_id)
            await self._wait_for_job_end(status)
            self.journal.ended_at = time.time()
            self._writer.save()
            self._trace.end(status)
            self._annotate(
                f"experiment {self.experiment_id} ended: {status}",
                "experiment-ended",
                start=self.journal.started_at,
                end=self.journal.ended_at,
            )
            await asyncio.to_thread(self.annotator.close)
        if status == "aborted":
            code = EXIT_ABORTED
        else:
            code = EXIT_OK if self.journal.succeeded else EXIT_FAILED
        return ExperimentRun(self.journal, self.journal_path, code)

    def _annotate(
        self, text: str, *tags: str, start: float | None = None, end: float | None = None
    ) -> None:
        """One Grafana annotation (queued; never blocks or raises)."""
        self.annotator.annotate(
            text,
            ("stormwatch", "chaos", f"experiment:{self.experiment_id}", *tags),
            start=start,
            end=end,
        )

    def _annotate_reverts(self, outcomes: list[RevertOutcome], reason: str) -> None:
        for outcome in outcomes:
            verb = "reverted" if outcome.ok else "NOT reverted"
            self._annotate(
                f"fault {outcome.fault_id} {verb} ({reason}): {outcome.detail}",
                "fault-reverted" if outcome.ok else "fault-revert-failed",
            )

    async def _body(self) -> ExperimentStatus:
        await self._recover_orphans()
        self._job = await self._open_job()
        self._check_blast_radius()
        if not await self._steady_state("before"):
            self.journal.error = "the steady-state hypothesis did not hold before the method"
            self.reporter.event(self.journal.error)
            return "failed"
        return await self._guarded(self._method_and_after())

    async def _method_and_after(self) -> ExperimentStatus:
        await self._method()
        if not await self._steady_state("after"):
            self.reporter.event(
                "the steady-state hypothesis did not hold after the method: deviated"
            )
            return "deviated"
        return "completed"

    # -- pre-flight and recovery -----------------------------------------------------------

    async def _recover_orphans(self) -> None:
        assert self._ledger is not None and self._session is not None
        orphans = self._ledger.orphans()
        if not orphans:
            return
        async with self._writer.activity("revert-orphaned-faults", "revert", "recovery") as record:
            self.reporter.event(f"reverting {len(orphans)} fault(s) left by a dead controller")
            outcomes = await revert_entries(
                self._ledger, orphans, reason="controller start", session=self._session
            )
            record.output = [
                {"fault_id": o.fault_id, "ok": o.ok, "detail": o.detail} for o in outcomes
            ]
            failed = [o for o in outcomes if not o.ok]
            self._annotate_reverts(outcomes, "left by a dead controller")
            if failed:
                raise FaultError(
                    f"could not revert {len(failed)} orphaned fault(s): "
                    + "; ".join(o.detail for o in failed)
                )

    # -- the job ---------------------------------------------------------------------------

    async def _open_job(self) -> JobRef:
        spec = self.experiment.job
        async with self._writer.activity("job", "wait", "warmup") as record:
            if self.config.attach_job is not None:
                job = self.target.jobs.attach(self.config.attach_job)
                self.reporter.event(f"attached to job {job.name}")
            else:
                spec = spec.model_copy(update={"name": job_name_for(spec.name, self.experiment_id)})
                job = self.target.jobs.start(spec)
                self.reporter.event(
                    f"started job {job.name} ({spec.steps} steps, checkpoint "
                    f"every {spec.checkpoint_every}, step delay {spec.step_delay:g} s)"
                )
            self.journal.job = job
            self._job = job  # from here on, a job this run started is waited for or stopped
            record.output = {
                "job": job.name,
                "log_dir": str(job.log_dir),
                "started_by_runner": job.started_by_runner,
            }
            await wait_until_stepping(
                job,
                self.target.jobs,
                timeout=spec.startup_timeout_seconds,
                status=self.reporter.status,
            )
            # Where each rank was when the job was first observed: a ``when.step`` trigger
            # already behind this is never injected (it would land on a finished job).
            logs = read_job_logs(job.log_dir)
            for rank, log in logs.items():
                last = log.last_step
                if last is not None and last.step is not None:
                    self._first_seen_steps[rank] = last.step
            record.output["first_seen_steps"] = {
                str(r): s for r, s in self._first_seen_steps.items()
            }
        return job

    async def _wait_for_job_end(self, status: ExperimentStatus) -> None:
        """Wait (bounded) for a job this run started to end; stop it when it does not.

        A run that did not complete stops its job at once: nothing is watching it any more.
        """
        job = self._job
        if job is None or not job.started_by_runner:
            return
        jobs = self.target.jobs
        deadline = time.monotonic() + self.config.job_end_timeout_seconds
        if status != "completed":
            deadline = time.monotonic()
        try:
            while not await asyncio.to_thread(jobs.ended, job.name):
                if time.monotonic() >= deadline:
                    self.reporter.event(f"stopping job {job.name}")
                    await asyncio.to_thread(jobs.stop, job.name)
                    return
                self.reporter.status(f"waiting for job {job.name} to end (torchrun shutdown)")
                await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            _uncancel()
            await asyncio.to_thread(jobs.stop, job.name)
        except ChaosError as exc:
            self.reporter.event(f"could not stop job {job.name}: {exc}")

    async def _recovery_check(self) -> bool:
        """After a fault that is over once sent (kill_rank), every rank must complete a step (or
        finish) *after* it: a job that had already finished, or never came back, did not recover.

        Journaled as the after-phase probe ``job-recovered``; True when there is nothing to check.
        """
        if not self._self_reverting_faults:
            return True
        provider = JobProvider(type="job", expect="progressing", window_seconds=3600.0)
        outcome = await self._probe(
            "job-recovered",
            provider,
            "after",
            self.config.recovery_timeout_seconds,
            1.0,
        )
        return outcome.ok

    # -- steady state ----------------------------------------------------------------------

    async def _steady_state(self, phase: Phase) -> bool:
        section = (
            self.journal.steady_state_before
            if phase == "before"
            else self.journal.steady_state_after
        )
        title = self.experiment.steady_state_hypothesis.title
        self.reporter.event(f"steady state ({phase}): {title}")
        met = True
        for probe in self.experiment.steady_state_hypothesis.probes:
            if phase not in probe.phases:
                continue
            outcome = await self._probe(
                probe.name,
                probe.provider,
                phase,
                probe.timeout_seconds,
                probe.poll_seconds,
            )
            met = met and outcome.ok
        if phase == "after":
            met = await self._recovery_check() and met
        section.met = met
        self._writer.save()
        return met

    async def _probe(
        self,
        name: str,
        provider: Provider,
        phase: Phase,
        timeout: float,
        poll: float,
        *,
        type_: str = "probe",
    ) -> ProbeOutcome:
        outcome = ProbeOutcome(False, "probe did not run")
        ctx = self._probe_context()
        async with self._writer.activity(name, type_, phase, raise_on_failure=False) as record:

            def on_poll(outcome: ProbeOutcome, elapsed: float) -> None:
                self.reporter.status(f"{name}: {outcome.detail} ({elapsed:.0f}/{timeout:g} s)")

            outcome = await wait_for(provider, ctx, timeout=timeout, poll=poll, on_poll=on_poll)
            record.output = {"ok": outcome.ok, "detail": outcome.detail, "observed": outcome.output}
            if not outcome.ok:
                record.status = "failed"
                record.error = outcome.detail
        mark = "held" if outcome.ok else "did NOT hold"
        self.reporter.event(f"  {name}: {mark}: {outcome.detail}")
        return outcome

    def _probe_context(self) -> ProbeContext:
        assert self._job is not None
        return ProbeContext(
            job=self._job,
            jobs=self.target.jobs,
            prometheus=self._prometheus,
            variables=self._variables(),
            since=self._last_fault_at,
            agents=self.target.agents,
            session=self._session,
        )

    def _variables(self) -> dict[str, str]:
        assert self._job is not None
        spec = self.experiment.job
        return {
            "job": self._job.name,
            "steps": str(spec.steps),
            "checkpoint_every": str(spec.checkpoint_every),
            "world_size": str(self._job.world_size),
        }


def run_experiment(runner: Runner) -> ExperimentRun:
    """Run ``runner`` in a fresh event loop; SIGINT/SIGTERM abort it cleanly (rollbacks still run).

    A second signal during cleanup is ignored: cleanup must finish (FC-13).
    """

    async def main() -> ExperimentRun:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        received: list[str] = []

        def on_signal(name: str) -> None:
            if not received:
                runner.reporter.event(f"{name} received: aborting")
                task.cancel()
            received.append(name)

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig.name)
        try:
            return await runner.run()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    return asyncio.run(main())


__all__ = [
    "EXIT_ABORTED",
    "EXIT_FAILED",
    "EXIT_OK",
    "ExperimentRun",
    "NullReporter",
    "Reporter",
    "Runner",
    "RunnerConfig",
    "job_name_for",
    "new_experiment_id",
    "run_experiment",
]
