"""The training job of one run: start it (or attach), wait until it steps, and see it end."""

from __future__ import annotations

import asyncio
import time

from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.execution.context import RunContext, uncancel
from stormwatch.chaos.execution.ids import job_name_for
from stormwatch.chaos.execution.readiness import wait_until_stepping
from stormwatch.chaos.target import JobControl
from stormwatch.contracts.journal import ExperimentStatus, JobRef


class JobLifecycle:
    """Opens the job of one run and, at the end, waits for (or stops) a job the run started.

    Args:
        ctx: the run (its experiment's ``job`` section; the job is written to its journal).
        jobs: job control of the target.
        attach_job: attach to this running job instead of starting the experiment's.
        job_end_timeout_seconds: how long :meth:`wait_for_end` waits for a job this run
            started to end after a completed run (torchrun shuts down for ~30 s after the
            last step) before stopping it.
    """

    def __init__(
        self,
        ctx: RunContext,
        *,
        jobs: JobControl,
        attach_job: str | None,
        job_end_timeout_seconds: float,
    ) -> None:
        self._ctx = ctx
        self._jobs = jobs
        self._attach_job = attach_job
        self._end_timeout = job_end_timeout_seconds
        self._job: JobRef | None = None
        self._first_seen_steps: dict[int, int] = {}

    @property
    def job(self) -> JobRef | None:
        """The job, once started or attached (None before, or when that failed)."""
        return self._job

    @property
    def first_seen_steps(self) -> dict[int, int]:
        """rank -> last completed step when the job was first seen stepping (a copy): a
        ``when.step`` trigger already behind this is never injected (it would land late)."""
        return dict(self._first_seen_steps)

    async def open(self) -> JobRef:
        """Start (or attach to) the job and wait until every rank completed a step; journaled as
        the warm-up activity ``job``.

        Raises:
            ActivityFailed: the job could not be started, ended first, or did not step within
                ``job.startup_timeout_seconds``.
        """
        ctx = self._ctx
        spec = ctx.experiment.job
        async with ctx.writer.activity("job", "wait", "warmup") as record:
            if self._attach_job is not None:
                job = self._jobs.attach(self._attach_job)
                ctx.reporter.event(f"attached to job {job.name}")
            else:
                spec = spec.model_copy(update={"name": job_name_for(spec.name, ctx.experiment_id)})
                job = self._jobs.start(spec)
                ctx.reporter.event(
                    f"started job {job.name} ({spec.steps} steps, checkpoint "
                    f"every {spec.checkpoint_every}, step delay {spec.step_delay:g} s)"
                )
            ctx.journal.job = job
            self._job = job  # from here on, a job this run started is waited for or stopped
            record.output = {
                "job": job.name,
                "log_dir": str(job.log_dir),
                "started_by_runner": job.started_by_runner,
            }
            self._first_seen_steps = await wait_until_stepping(
                job,
                self._jobs,
                timeout=spec.startup_timeout_seconds,
                status=ctx.reporter.status,
            )
            record.output["first_seen_steps"] = {
                str(r): s for r, s in self._first_seen_steps.items()
            }
        return job

    async def wait_for_end(self, status: ExperimentStatus) -> None:
        """Wait (bounded) for a job this run started to end; stop it when it does not.

        A run that did not complete stops its job at once: nothing is watching it any more.
        A job that cannot be stopped (:class:`ChaosError`) is reported, not raised.
        """
        job = self._job
        if job is None or not job.started_by_runner:
            return
        jobs, reporter = self._jobs, self._ctx.reporter
        deadline = time.monotonic() + self._end_timeout
        if status != "completed":
            deadline = time.monotonic()
        try:
            while not await asyncio.to_thread(jobs.ended, job.name):
                if time.monotonic() >= deadline:
                    reporter.event(f"stopping job {job.name}")
                    await asyncio.to_thread(jobs.stop, job.name)
                    return
                reporter.status(f"waiting for job {job.name} to end (torchrun shutdown)")
                await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            uncancel()
            await asyncio.to_thread(jobs.stop, job.name)
        except ChaosError as exc:
            reporter.event(f"could not stop job {job.name}: {exc}")


__all__ = ["JobLifecycle"]
