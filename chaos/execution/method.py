"""The method of an experiment: actions (targets, background), ``until`` waits, pauses, and the
safeguards watching them. Part of :class:`stormwatch.chaos.execution.runner.Runner` (a mixin)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from stormwatch.chaos.errors import ActivityFailed, ChaosError
from stormwatch.chaos.execution.injector import Injector
from stormwatch.chaos.execution.journal import ExperimentStatus, FaultInjected, Phase
from stormwatch.chaos.execution.safeguards import watch
from stormwatch.chaos.experiment.model import (
    ActionActivity,
    Fault,
    PauseActivity,
    ProbeActivity,
    PrometheusProvider,
    UntilActivity,
)
from stormwatch.chaos.experiment.selection import (
    SelectionError,
    Shape,
    blast_radius_problem,
    expand,
)
from stormwatch.chaos.faults import reverts_itself
from stormwatch.chaos.faults.specs import target_nodes, target_rank

if TYPE_CHECKING:
    from stormwatch.chaos.execution.runner import Runner


class MethodMixin:
    """The method half of the runner (see :class:`~stormwatch.chaos.execution.runner.Runner`)."""

    async def _guarded(
        self: Runner, body: Coroutine[Any, Any, ExperimentStatus]
    ) -> ExperimentStatus:
        """Run ``body`` while the safeguards hold; the first that fails cancels it (failed)."""
        main = asyncio.create_task(body)
        if not self.experiment.safeguards:
            return await main
        guard = asyncio.create_task(watch(self.experiment.safeguards, self._probe_context))
        try:
            await asyncio.wait({main, guard}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            for task in (main, guard):
                task.cancel()
            await asyncio.gather(main, guard, return_exceptions=True)
            raise
        if main.done():
            guard.cancel()
            await asyncio.gather(guard, return_exceptions=True)
            return main.result()
        tripped = guard.result()
        main.cancel()
        await asyncio.gather(main, return_exceptions=True)
        assert tripped is not None
        name = tripped.safeguard.name
        async with self._writer.activity(
            name, "safeguard", "method", raise_on_failure=False
        ) as record:
            record.status, record.error = "failed", tripped.outcome.detail
            record.output = {"detail": tripped.outcome.detail, "observed": tripped.outcome.output}
        self.journal.error = (
            f"safeguard {name} tripped: {tripped.outcome.detail}; injection stopped, rolled back"
        )
        self.reporter.event(f"safeguard {name} tripped: {tripped.outcome.detail}: aborting")
        return "failed"

    # -- method ----------------------------------------------------------------------------

    async def _method(self: Runner) -> None:
        self.reporter.event("method")
        background: list[asyncio.Task[None]] = []
        try:
            await self._method_steps(background)
            for task in background:  # the method ends when its background actions have
                await task
        finally:
            for task in background:
                if not task.done():
                    task.cancel()
            if background:
                await asyncio.gather(*background, return_exceptions=True)

    async def _method_steps(self: Runner, background: list[asyncio.Task[None]]) -> None:
        for index, activity in enumerate(self.experiment.method):
            try:
                if isinstance(activity, ActionActivity) and activity.background:
                    background.append(asyncio.create_task(self._action(activity)))
                elif isinstance(activity, ActionActivity):
                    await self._action(activity)
                elif isinstance(activity, UntilActivity):
                    await self._until(activity)
                elif isinstance(activity, ProbeActivity):
                    outcome = await self._probe(
                        activity.name,
                        activity.provider,
                        "method",
                        activity.timeout_seconds,
                        activity.poll_seconds,
                    )
                    if not outcome.ok:
                        raise ActivityFailed(f"method probe {activity.name}: {outcome.detail}")
                else:
                    await self._pause(activity, "method")
            except BaseException:
                for later in self.experiment.method[index + 1 :]:
                    self._writer.skipped(
                        later.name,
                        later.type,
                        "method",
                        "an earlier activity failed or the run was interrupted",
                    )
                raise

    def _shape(self: Runner) -> Shape:
        """The job's layout on the target: its nodes in order, ranks spread evenly."""
        nodes = tuple(a.node for a in self.target.agents)
        world = self._job.world_size if self._job is not None else self.target.world_size
        if not nodes or world % len(nodes):
            return Shape(("node0",), world)
        return Shape(nodes, world // len(nodes))

    def _check_blast_radius(self: Runner) -> None:
        """Refuse (before anything is injected) an experiment touching too many ranks."""
        try:
            problem = blast_radius_problem(self.experiment, self._shape())
        except SelectionError as exc:
            raise ChaosError(f"cannot place the faults on this job: {exc}") from exc
        if problem is not None:
            raise ChaosError(f"blast radius: {problem}; nothing was injected")

    async def _action(self: Runner, activity: ActionActivity) -> None:
        """Inject the action's fault(s): one per selected rank/node with ``target``."""
        try:
            faults = expand(activity, self._shape())
        except SelectionError as exc:
            raise ActivityFailed(f"{activity.name}: {exc}") from exc
        for index, fault in enumerate(faults):
            where = target_nodes(fault) or [f"rank{target_rank(fault)}"]
            name = activity.name if len(faults) == 1 else f"{activity.name}@{','.join(where)}"
            await self._inject(activity, fault, name, wait=index == 0)
        if activity.pause_after_seconds:
            await asyncio.sleep(activity.pause_after_seconds)

    async def _inject(
        self: Runner, activity: ActionActivity, fault: Fault, name: str, wait: bool
    ) -> None:
        assert self._job is not None and self._ledger is not None and self._agents is not None
        injector = Injector(
            ledger=self._ledger,
            agents=self._agents,
            target=self.target,
            job=self._job,
            experiment_id=self.experiment_id,
            status=self.reporter.status,
            step_poll_seconds=self.config.step_poll_seconds,
            first_seen_steps=self._first_seen_steps,
        )
        rank = target_rank(fault)
        async with self._writer.activity(name, "action", "method") as record:
            step = attempt = None
            if activity.when is not None and wait:
                step, attempt = await injector.wait_for_step(activity.when, rank or 0)
            injected = await injector.inject(name, fault, recorded=self._writer.save)
            result = injected.result
            self._last_fault_at = result.applied_at
            self._annotate(
                f"fault {injected.entry.id} injected: {fault.kind} on "
                f"{'rank ' + str(rank) if rank is not None else ','.join(target_nodes(fault))} "
                f"({injected.entry.target.node}): {result.detail}",
                "fault-injected",
                fault.kind,
                start=result.applied_at,
            )
            if reverts_itself(fault):
                self._self_reverting_faults.append(name)
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
            self.reporter.event(
                f"  {name}: {result.detail}" + (f" after step {step}" if step is not None else "")
            )

    async def _until(self: Runner, activity: UntilActivity) -> None:
        provider = PrometheusProvider(
            type="prometheus", query=activity.query, tolerance=activity.tolerance
        )
        outcome = await self._probe(
            activity.name,
            provider,
            "method",
            activity.timeout_seconds,
            activity.poll_seconds,
            type_="until",
        )
        if not outcome.ok:
            raise ActivityFailed(f"until {activity.name}: {outcome.detail}")

    async def _pause(self: Runner, activity: PauseActivity, phase: Phase) -> None:
        async with self._writer.activity(activity.name, "pause", phase) as record:
            self.reporter.status(f"{activity.name}: pausing {activity.seconds:g} s")
            await asyncio.sleep(activity.seconds)
            record.output = {"seconds": activity.seconds}


__all__ = ["MethodMixin"]
