"""Run an experiment: pre-flight, steady state before, method, steady state after, rollbacks.

Order (chaostoolkit's, plus the ledger's guarantees, FC-13), and who does each step:

1. pre-flight: the services the experiment needs answer (nothing written yet;
   :func:`~.readiness.preflight`);
2. recovery: open faults of dead controllers in the ledger are reverted
   (:class:`~.rollback.RollbackExecutor`);
3. the job is started on the lab (or attached with ``--job``) and warmed up
   (every rank completed a step; :class:`~.lifecycle.JobLifecycle`);
4. steady-state hypothesis *before*; the method runs only if it held
   (:class:`~.checks.HypothesisChecker`);
5. method: actions wait for ``when.step`` (rank logs), locate the rank, write
   the fault to the ledger, *then* send it; probes wait for their condition
   (:class:`~.method.MethodExecutor`, under a :class:`~.safeguards.SafeguardWatcher`);
6. steady-state hypothesis *after*;
7. rollbacks, per ``rollback_strategy`` (default ``always``: also after a
   deviation, a failure and an abort; :class:`~.rollback.RollbackExecutor`); after a
   revert, the target returns the nodes the scheduler took out during the fault to
   service (``Target.nodes``);
8. cleanup: every fault of this experiment still open in the ledger is
   reverted, whatever happened (the same).

SIGINT/SIGTERM (via :func:`run_experiment`) cancel the run: injection stops,
steps 7-8 still run, the journal is written, the status is ``aborted``.
The journal is rewritten after every activity.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.execution.checks import HypothesisChecker, ProbeChecker, job_variables
from stormwatch.chaos.execution.context import RunAnnotations, RunContext, uncancel
from stormwatch.chaos.execution.ids import job_name_for, new_experiment_id
from stormwatch.chaos.execution.injection.injector import Injector
from stormwatch.chaos.execution.injection.tracker import FaultTracker
from stormwatch.chaos.execution.journal_writer import JournalWriter
from stormwatch.chaos.execution.lifecycle import JobLifecycle
from stormwatch.chaos.execution.method import MethodExecutor, job_shape
from stormwatch.chaos.execution.probes import ProbeContext
from stormwatch.chaos.execution.readiness import preflight
from stormwatch.chaos.execution.reporter import NullReporter, Reporter
from stormwatch.chaos.execution.rollback import LedgerReverter, RollbackExecutor
from stormwatch.chaos.execution.safeguards import SafeguardWatcher
from stormwatch.chaos.execution.tracing import ExperimentTrace
from stormwatch.chaos.experiment.model import Experiment
from stormwatch.chaos.ledger.ledger import Ledger, ledger_path
from stormwatch.chaos.target import Target
from stormwatch.clients import AsyncPrometheusClient
from stormwatch.contracts.journal import ExperimentStatus, JobRef, Journal
from stormwatch.dashboards.annotations import Annotator

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


@dataclass(frozen=True)
class _Services:
    """What one run talks to, open while :meth:`Runner.run` runs."""

    session: aiohttp.ClientSession
    agents: AgentClient
    prometheus: AsyncPrometheusClient | None
    ledger: Ledger


class Runner:
    """Runs one validated experiment against a target: one object per run.

    The runner orders the phases and decides the verdict; the work is done by
    collaborators it builds for the run, each owning its state and sharing only the
    :class:`~stormwatch.chaos.execution.context.RunContext` (experiment, id, journal
    writer, reporter, annotations):

    - :class:`~.lifecycle.JobLifecycle`: starts or attaches the job, sees it end;
    - :class:`~.tracker.FaultTracker`: the run's faults (open ones in the ledger, the
      latest fault time, the faults that revert themselves);
    - :class:`~.checks.ProbeChecker` / :class:`~.checks.HypothesisChecker`: journaled
      probes and the steady-state hypothesis;
    - :class:`~.method.MethodExecutor`: the method (faults sent by the
      :class:`~.injector.Injector`, ledger first) under a
      :class:`~.safeguards.SafeguardWatcher`;
    - :class:`~.rollback.RollbackExecutor`: orphan recovery, rollbacks, final revert.

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
        journal = Journal(
            experiment_id=self.experiment_id,
            title=experiment.title,
            file=self.source,
            experiment=experiment.model_dump(mode="json"),
            started_at=time.time(),
        )
        self._trace = ExperimentTrace(self.experiment_id, experiment.title)
        self._writer = JournalWriter(journal, self.journal_path, self._trace)
        self._ctx = RunContext(
            experiment=experiment,
            experiment_id=self.experiment_id,
            writer=self._writer,
            reporter=self.reporter,
            annotations=RunAnnotations(self.annotator, self.experiment_id),
        )

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
        annotations = self._ctx.annotations
        async with aiohttp.ClientSession() as session:
            services = await self._open(session)
            faults = FaultTracker(services.ledger, self.experiment_id)
            reverts = RollbackExecutor(
                self._ctx,
                faults=faults,
                reverter=LedgerReverter(services.ledger, session),
                nodes=self.target.nodes,
            )
            lifecycle = JobLifecycle(
                self._ctx,
                jobs=self.target.jobs,
                attach_job=self.config.attach_job,
                job_end_timeout_seconds=self.config.job_end_timeout_seconds,
            )
            status = await self._outcome(self._body(services, faults, reverts, lifecycle))
            self.journal.status = status
            self._writer.save()
            job = lifecycle.job
            probes = None if job is None else self._probe_checker(services, faults, job)
            rollbacks_ok = await reverts.rollbacks(status, probes)
            cleanup_ok = await reverts.cleanup(status)
            self.journal.rollbacks_ok = rollbacks_ok and cleanup_ok
            self.journal.faults = faults.entries()
            await lifecycle.wait_for_end(status)
            self.journal.ended_at = time.time()
            self._writer.save()
            self._trace.end(status)
            annotations.annotate(
                f"experiment {self.experiment_id} ended: {status}",
                "experiment-ended",
                start=self.journal.started_at,
                end=self.journal.ended_at,
            )
            await annotations.close()
        if status == "aborted":
            code = EXIT_ABORTED
        else:
            code = EXIT_OK if self.journal.succeeded else EXIT_FAILED
        return ExperimentRun(self.journal, self.journal_path, code)

    async def _open(self, session: aiohttp.ClientSession) -> _Services:
        """Pre-flight, then the ledger and the experiment folder (journal, copy of the file).

        Raises:
            LabNotReady: pre-flight failed (nothing was started or written).
        """
        agents = AgentClient(session)
        prometheus = None
        if self.target.prometheus_url:
            prometheus = AsyncPrometheusClient(
                self.target.prometheus_url, options=self.target.prometheus_http, session=session
            )
        await preflight(self.experiment, self.target, prometheus=prometheus, agents=agents)
        ledger = Ledger(ledger_path(self.target.run_dir))
        self.experiment_dir.mkdir(parents=True, exist_ok=True)
        self._trace.export_to(self.experiment_dir)
        try:
            shutil.copyfile(self.source, self.experiment_dir / "experiment.yaml")
        except OSError as exc:  # the journal keeps the experiment itself; the copy is a convenience
            logger.warning("could not copy %s into %s: %s", self.source, self.experiment_dir, exc)
        self._writer.save()
        self._ctx.annotations.annotate(
            f"experiment {self.experiment_id} started", "experiment-started"
        )
        return _Services(session=session, agents=agents, prometheus=prometheus, ledger=ledger)

    async def _outcome(self, body: Coroutine[Any, Any, ExperimentStatus]) -> ExperimentStatus:
        """``body``'s status; an interrupt is ``aborted``, an error ``failed`` (with the
        journal's ``error`` set): whatever happened, the rollbacks run next (FC-13)."""
        journal, reporter = self.journal, self.reporter
        try:
            return await body
        except asyncio.CancelledError:
            uncancel()
            journal.error = "interrupted: injection stopped; faults reverted"
            reporter.event("interrupted: stopping injection, reverting faults")
            return "aborted"
        except ChaosError as exc:
            journal.error = str(exc)
            reporter.event(f"failed: {exc}")
            return "failed"
        except Exception as exc:  # a foreign error or a bug: still roll back (FC-13)
            logger.exception("experiment %s failed unexpectedly", self.experiment_id)
            journal.error = f"unexpected {type(exc).__name__}: {exc}"
            reporter.event(f"failed: {journal.error}")
            return "failed"

    async def _body(
        self,
        services: _Services,
        faults: FaultTracker,
        reverts: RollbackExecutor,
        lifecycle: JobLifecycle,
    ) -> ExperimentStatus:
        """Recovery, the job, steady state before, then the method and steady state after
        under the safeguards."""
        await reverts.recover_orphans()
        job = await lifecycle.open()
        probes = self._probe_checker(services, faults, job)
        sender = Injector(
            ledger=services.ledger,
            agents=services.agents,
            target=self.target,
            job=job,
            experiment_id=self.experiment_id,
            status=self.reporter.status,
            step_poll_seconds=self.config.step_poll_seconds,
            first_seen_steps=lifecycle.first_seen_steps,
        )
        method = MethodExecutor(
            self._ctx,
            shape=job_shape(self.target, job),
            sender=sender,
            probes=probes,
            faults=faults,
        )
        method.check_blast_radius()
        hypothesis = HypothesisChecker(
            self._ctx,
            probes=probes,
            faults=faults,
            recovery_timeout_seconds=self.config.recovery_timeout_seconds,
        )
        if not await hypothesis.check("before"):
            self.journal.error = "the steady-state hypothesis did not hold before the method"
            self.reporter.event(self.journal.error)
            return "failed"
        watcher = SafeguardWatcher(self._ctx, context=probes.context)
        return await watcher.guard(self._method_and_after(method, hypothesis))

    async def _method_and_after(
        self, method: MethodExecutor, hypothesis: HypothesisChecker
    ) -> ExperimentStatus:
        await method.run()
        if not await hypothesis.check("after"):
            self.reporter.event(
                "the steady-state hypothesis did not hold after the method: deviated"
            )
            return "deviated"
        return "completed"

    def _probe_checker(
        self, services: _Services, faults: FaultTracker, job: JobRef
    ) -> ProbeChecker:
        base = ProbeContext(
            job=job,
            jobs=self.target.jobs,
            prometheus=services.prometheus,
            variables=job_variables(self.experiment.job, job),
            started_at=self.journal.started_at,
            agents=self.target.agents,
            session=services.session,
        )
        return ProbeChecker(self._ctx, base=base, faults=faults)


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
