"""The method of an experiment: actions (targets, background), probes, ``until`` waits, pauses.

:class:`MethodExecutor` runs the method's activities in order against one job:
actions are placed on the job's ranks/nodes (:func:`job_shape`), wait for their
``when.step``, and are sent by a :class:`FaultSender` (the
:class:`~stormwatch.chaos.execution.injection.injector.Injector`: ledger first, then the
fault); each injected fault is noted in the run's
:class:`~stormwatch.chaos.execution.injection.tracker.FaultTracker`, from which the
rollback executor reverts it whatever happens next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from stormwatch.chaos.errors import ActivityFailed, ChaosError, SelectionError
from stormwatch.chaos.execution.checks import ProbeChecker
from stormwatch.chaos.execution.context import RunContext, pause
from stormwatch.chaos.execution.injection.injector import Injected
from stormwatch.chaos.execution.injection.tracker import FaultTracker
from stormwatch.chaos.experiment.model import (
    ActionActivity,
    ProbeActivity,
    PrometheusProvider,
    UntilActivity,
    When,
)
from stormwatch.chaos.experiment.selection import (
    Shape,
    blast_radius_problem,
    expand,
)
from stormwatch.chaos.target import Target
from stormwatch.contracts.journal import FaultInjected, JobRef
from stormwatch.faults import ExperimentFault


class FaultSender(Protocol):
    """What the method needs of :class:`~stormwatch.chaos.execution.injection.injector.Injector`."""

    async def wait_for_step(self, when: When, rank: int) -> tuple[int, int]:
        """Wait until ``rank`` completed ``when.step``; the (step, attempt) seen then."""
        ...

    async def inject(
        self, name: str, fault: ExperimentFault, *, recorded: Callable[[], None]
    ) -> Injected:
        """Record ``fault`` in the ledger (then call ``recorded()``), send it, confirm it."""
        ...


def job_shape(target: Target, job: JobRef) -> Shape:
    """The job's layout on the target: its nodes in order, ranks spread evenly (one node
    ``node0`` holding every rank when the target has no agents or they do not divide it)."""
    nodes = tuple(a.node for a in target.agents)
    world = job.world_size
    if not nodes or world % len(nodes):
        return Shape(("node0",), world)
    return Shape(nodes, world // len(nodes))


class MethodExecutor:
    """Runs the method of one run.

    Args:
        ctx: the run (its experiment's method; each activity is journaled in ``method``).
        shape: where the job's ranks are (target selectors and blast radius).
        sender: waits for a fault's step and injects it (ledger first).
        probes: runs the method's probes and ``until`` waits.
        faults: notes each injected fault (latest fault time, self-reverting faults).
    """

    def __init__(
        self,
        ctx: RunContext,
        *,
        shape: Shape,
        sender: FaultSender,
        probes: ProbeChecker,
        faults: FaultTracker,
    ) -> None:
        self._ctx = ctx
        self._shape = shape
        self._sender = sender
        self._probes = probes
        self._faults = faults

    def check_blast_radius(self) -> None:
        """Refuse (before anything is injected) an experiment touching too many ranks.

        Raises:
            ChaosError: a selector does not fit the job, or the faults exceed
                ``blast_radius.max_fraction_of_ranks``.
        """
        try:
            problem = blast_radius_problem(self._ctx.experiment, self._shape)
        except SelectionError as exc:
            raise ChaosError(f"cannot place the faults on this job: {exc}") from exc
        if problem is not None:
            raise ChaosError(f"blast radius: {problem}; nothing was injected")

    async def run(self) -> None:
        """Run every activity in order; background actions are awaited at the end.

        An activity that fails (or an interrupt) journals the later ones as skipped,
        cancels the background actions and propagates.

        Raises:
            ActivityFailed: an activity failed (a probe or ``until`` did not hold, a fault
                could not be placed or injected).
        """
        self._ctx.reporter.event("method")
        background: list[asyncio.Task[None]] = []
        try:
            await self._steps(background)
            for task in background:  # the method ends when its background actions have
                await task
        finally:
            for task in background:
                if not task.done():
                    task.cancel()
            if background:
                await asyncio.gather(*background, return_exceptions=True)

    async def _steps(self, background: list[asyncio.Task[None]]) -> None:
        method = self._ctx.experiment.method
        for index, activity in enumerate(method):
            try:
                if isinstance(activity, ActionActivity) and activity.background:
                    background.append(asyncio.create_task(self._action(activity)))
                elif isinstance(activity, ActionActivity):
                    await self._action(activity)
                elif isinstance(activity, UntilActivity):
                    await self._until(activity)
                elif isinstance(activity, ProbeActivity):
                    outcome = await self._probes.activity(activity, "method")
                    if not outcome.ok:
                        raise ActivityFailed(f"method probe {activity.name}: {outcome.detail}")
                else:
                    await pause(self._ctx, activity, "method")
            except BaseException:
                for later in method[index + 1 :]:
                    self._ctx.writer.skipped(
                        later.name,
                        later.type,
                        "method",
                        "an earlier activity failed or the run was interrupted",
                    )
                raise

    async def _action(self, activity: ActionActivity) -> None:
        """Inject the action's fault(s): one per selected rank/node with ``target``."""
        try:
            faults = expand(activity, self._shape)
        except SelectionError as exc:
            raise ActivityFailed(f"{activity.name}: {exc}") from exc
        for index, fault in enumerate(faults):
            where = fault.target_nodes() or [f"rank{fault.target_rank()}"]
            name = activity.name if len(faults) == 1 else f"{activity.name}@{','.join(where)}"
            await self._inject(activity, fault, name, wait=index == 0)
        if activity.pause_after_seconds:
            await asyncio.sleep(activity.pause_after_seconds)

    async def _inject(
        self, activity: ActionActivity, fault: ExperimentFault, name: str, wait: bool
    ) -> None:
        ctx = self._ctx
        rank = fault.target_rank()
        async with ctx.writer.activity(name, "action", "method") as record:
            step = attempt = None
            if activity.when is not None and wait:
                step, attempt = await self._sender.wait_for_step(activity.when, rank or 0)
            injected = await self._sender.inject(name, fault, recorded=ctx.writer.save)
            result = injected.result
            self._faults.injected(name, fault, injected)
            where = f"rank {rank}" if rank is not None else ",".join(fault.target_nodes())
            ctx.annotations.annotate(
                f"fault {injected.entry.id} injected: {fault.kind} on "
                f"{where} ({injected.entry.target.node}): {result.detail}",
                "fault-injected",
                fault.kind,
                start=result.applied_at,
            )
            record.output = FaultInjected(
                fault_id=injected.entry.id,
                kind=fault.kind,
                rank=rank,
                node=injected.entry.target.node,
                target_pid=result.target_pid,
                applied_at=result.applied_at,
                expires_at=result.expires_at,
                step=step,
                attempt=attempt,
                detail=result.detail,
                background=activity.background,
            ).model_dump()
            ctx.reporter.event(
                f"  {name}: {result.detail}" + (f" after step {step}" if step is not None else "")
            )

    async def _until(self, activity: UntilActivity) -> None:
        provider = PrometheusProvider(
            type="prometheus", query=activity.query, tolerance=activity.tolerance
        )
        outcome = await self._probes.probe(
            activity.name,
            provider,
            "method",
            activity.timeout_seconds,
            activity.poll_seconds,
            type_="until",
        )
        if not outcome.ok:
            raise ActivityFailed(f"until {activity.name}: {outcome.detail}")


__all__ = ["FaultSender", "MethodExecutor", "job_shape"]
