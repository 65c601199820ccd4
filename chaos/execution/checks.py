"""Journaled probes and the steady-state hypothesis of one run.

:class:`ProbeChecker` runs one probe (polls its provider until it holds or times
out) and journals it; :class:`HypothesisChecker` checks the experiment's
steady-state hypothesis before and after the method, plus (after) the recovery
of the job from faults that are over once sent.
"""

from __future__ import annotations

import dataclasses

from stormwatch.chaos.execution.context import RunContext
from stormwatch.chaos.execution.injection.tracker import FaultTracker
from stormwatch.chaos.execution.probes import ProbeContext, ProbeOutcome, wait_for
from stormwatch.chaos.experiment.model import JobProvider, JobSection, ProbeActivity, Provider
from stormwatch.contracts.journal import JobRef, Phase


class ProbeChecker:
    """Runs and journals the probes of one run against its job.

    Args:
        ctx: the run.
        base: what probes read (job, job control, Prometheus, agents, session, placeholder
            values, see :func:`job_variables`); ``since`` is filled in at each probe.
        faults: when the latest fault took effect (``progressing`` counts steps after it).
    """

    def __init__(self, ctx: RunContext, *, base: ProbeContext, faults: FaultTracker) -> None:
        self._ctx = ctx
        self._base = base
        self._faults = faults

    def context(self) -> ProbeContext:
        """What a provider reads now (the latest fault time changes the ``job`` provider's meaning)."""
        return dataclasses.replace(self._base, since=self._faults.last_fault_at)

    async def probe(
        self,
        name: str,
        provider: Provider,
        phase: Phase,
        timeout: float,
        poll: float,
        *,
        type_: str = "probe",
    ) -> ProbeOutcome:
        """Poll ``provider`` every ``poll`` s until it holds or ``timeout`` s pass; journal it.

        A condition that does not hold is the outcome (record ``failed``), not an exception.
        """
        outcome = ProbeOutcome(False, "probe did not run")
        ctx = self.context()
        reporter = self._ctx.reporter
        async with self._ctx.writer.activity(name, type_, phase, raise_on_failure=False) as record:

            def on_poll(outcome: ProbeOutcome, elapsed: float) -> None:
                reporter.status(f"{name}: {outcome.detail} ({elapsed:.0f}/{timeout:g} s)")

            outcome = await wait_for(provider, ctx, timeout=timeout, poll=poll, on_poll=on_poll)
            record.output = {"ok": outcome.ok, "detail": outcome.detail, "observed": outcome.output}
            if not outcome.ok:
                record.status = "failed"
                record.error = outcome.detail
        mark = "held" if outcome.ok else "did NOT hold"
        reporter.event(f"  {name}: {mark}: {outcome.detail}")
        return outcome

    async def activity(self, activity: ProbeActivity, phase: Phase) -> ProbeOutcome:
        """Run a ``probe`` activity of the method or the rollbacks."""
        return await self.probe(
            activity.name,
            activity.provider,
            phase,
            activity.timeout_seconds,
            activity.poll_seconds,
        )


def job_variables(spec: JobSection, job: JobRef) -> dict[str, str]:
    """The placeholder values probes may use: ``job``, ``steps``, ``checkpoint_every``,
    ``world_size`` (of ``job``, the job actually running ``spec``)."""
    return {
        "job": job.name,
        "steps": str(spec.steps),
        "checkpoint_every": str(spec.checkpoint_every),
        "world_size": str(job.world_size),
    }


class HypothesisChecker:
    """Checks the steady-state hypothesis of one run, and (after) that the job recovered.

    Args:
        ctx: the run (the hypothesis; ``met`` is written to its journal).
        probes: runs each probe.
        faults: which faults are over once sent (each needs the job to recover).
        recovery_timeout_seconds: how long the after-phase waits for every rank to complete
            a step after such a fault before it says "not recovered".
    """

    def __init__(
        self,
        ctx: RunContext,
        *,
        probes: ProbeChecker,
        faults: FaultTracker,
        recovery_timeout_seconds: float,
    ) -> None:
        self._ctx = ctx
        self._probes = probes
        self._faults = faults
        self._recovery_timeout = recovery_timeout_seconds

    async def check(self, phase: Phase) -> bool:
        """Run the hypothesis' probes of ``phase`` (``before`` or ``after``); True when all held."""
        journal = self._ctx.journal
        section = journal.steady_state_before if phase == "before" else journal.steady_state_after
        hypothesis = self._ctx.experiment.steady_state_hypothesis
        self._ctx.reporter.event(f"steady state ({phase}): {hypothesis.title}")
        # After the fault, recovery comes first: the experiment's own probes (a job that
        # finishes) read after it, not "all 4 ranks progressing" after "finished".
        met = await self._recovered() if phase == "after" else True
        for probe in hypothesis.probes:
            if phase not in probe.phases:
                continue
            outcome = await self._probes.probe(
                probe.name,
                probe.provider,
                phase,
                probe.timeout_seconds,
                probe.poll_seconds,
            )
            met = met and outcome.ok
        section.met = met
        self._ctx.writer.save()
        return met

    async def _recovered(self) -> bool:
        """After a fault that is over once sent (kill_rank), every rank must complete a step (or
        finish) *after* it: a job that had already finished, or never came back, did not recover.

        Journaled as the after-phase probe ``job-recovered``, the phase's first; True when there
        is nothing to check.
        """
        if not self._faults.self_reverting:
            return True
        provider = JobProvider(type="job", expect="progressing", window_seconds=3600.0)
        outcome = await self._probes.probe(
            "job-recovered", provider, "after", self._recovery_timeout, 1.0
        )
        return outcome.ok


__all__ = ["HypothesisChecker", "ProbeChecker", "job_variables"]
