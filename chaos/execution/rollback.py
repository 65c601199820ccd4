"""Reverts of one run: faults left by dead controllers, the rollbacks, and the final revert (FC-13).

:class:`RollbackExecutor` reverts what the run's
:class:`~stormwatch.chaos.execution.injection.tracker.FaultTracker` says is open, through a
:class:`Reverter` (:class:`LedgerReverter`: the fault kinds' idempotent reverts,
closing each ledger row). Its steps never skip one another: a rollback that fails
(or a second interrupt) is journaled and the next still runs.

After each revert the target's :class:`~stormwatch.chaos.node_service.NodeService` (a Slurm
target's) returns the nodes of the reverted faults to service when the scheduler took
them out during the fault (a node cut off is set DOWN after ``SlurmdTimeout`` and stays
DOWN once its link heals), journaled as ``return-nodes-to-service`` when a node was not
simply in service.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Protocol

import aiohttp

from stormwatch.chaos.errors import ChaosError, FaultError
from stormwatch.chaos.execution.checks import ProbeChecker
from stormwatch.chaos.execution.context import RunContext, pause, uncancel
from stormwatch.chaos.execution.injection.tracker import FaultTracker
from stormwatch.chaos.experiment.model import ProbeActivity, RevertActivity, RollbackStrategy
from stormwatch.chaos.ledger.ledger import Ledger
from stormwatch.chaos.ledger.revert import RevertOutcome, revert_entries, revert_open
from stormwatch.chaos.node_service import NodeService
from stormwatch.contracts.fault_ledger import LedgerEntry
from stormwatch.contracts.journal import ExperimentStatus, Phase

logger = logging.getLogger(__name__)


class Reverter(Protocol):
    """Reverts ledger entries and closes them (each fault on its own; never raises for one)."""

    async def revert_open(self, *, reason: str, experiment_id: str | None) -> list[RevertOutcome]:
        """Revert every open fault of ``experiment_id`` (every open fault when None)."""
        ...

    async def revert_entries(
        self, entries: list[LedgerEntry], *, reason: str
    ) -> list[RevertOutcome]:
        """Revert each open entry of ``entries``."""
        ...


class LedgerReverter:
    """:class:`Reverter` of a ledger (:mod:`stormwatch.chaos.ledger.revert`).

    Args:
        ledger: the fault ledger.
        session: HTTP session for the agents' fault API.
    """

    def __init__(self, ledger: Ledger, session: aiohttp.ClientSession) -> None:
        self._ledger = ledger
        self._session = session

    async def revert_open(self, *, reason: str, experiment_id: str | None) -> list[RevertOutcome]:
        return await revert_open(
            self._ledger, reason=reason, experiment_id=experiment_id, session=self._session
        )

    async def revert_entries(
        self, entries: list[LedgerEntry], *, reason: str
    ) -> list[RevertOutcome]:
        return await revert_entries(self._ledger, entries, reason=reason, session=self._session)


def rollbacks_run(
    strategy: RollbackStrategy, status: ExperimentStatus, *, met_before: bool | None
) -> bool:
    """Whether the rollbacks run, per chaostoolkit's runtime strategies (chaostoolkit-lib
    PR #179): ``always``; ``deviated`` only after a deviation; ``never``; ``default``
    unless the hypothesis failed before the method (``met_before`` False) or the run was
    interrupted."""
    return (
        strategy == "always"
        or (strategy == "deviated" and status == "deviated")
        or (strategy == "default" and status != "aborted" and met_before is not False)
    )


class RollbackExecutor:
    """Reverts the faults of one run, and runs its rollbacks.

    Args:
        ctx: the run (its experiment's rollbacks and strategy; each step is journaled).
        faults: what the run injected (this run's open faults; the ledger's orphans).
        reverter: reverts ledger entries.
        nodes: returns the nodes of reverted faults to service (the target's); None: none.
    """

    def __init__(
        self,
        ctx: RunContext,
        *,
        faults: FaultTracker,
        reverter: Reverter,
        nodes: NodeService | None = None,
    ) -> None:
        self._ctx = ctx
        self._faults = faults
        self._reverter = reverter
        self._nodes = nodes
        #: Faults whose nodes were already handed to ``nodes`` (once per fault).
        self._returned: set[str] = set()

    async def recover_orphans(self) -> None:
        """Revert the open faults of dead controllers (journaled in ``recovery``).

        Raises:
            ActivityFailed: one of them could not be reverted (nothing is injected then).
        """
        ctx = self._ctx
        orphans = self._faults.ledger.orphans()
        if not orphans:
            return
        async with ctx.writer.activity("revert-orphaned-faults", "revert", "recovery") as record:
            ctx.reporter.event(f"reverting {len(orphans)} fault(s) left by a dead controller")
            outcomes = await self._reverter.revert_entries(orphans, reason="controller start")
            record.output = [
                {"fault_id": o.fault_id, "ok": o.ok, "detail": o.detail} for o in outcomes
            ]
            failed = [o for o in outcomes if not o.ok]
            ctx.annotations.reverts(outcomes, "left by a dead controller")
            if failed:
                raise FaultError(
                    f"could not revert {len(failed)} orphaned fault(s): "
                    + "; ".join(o.detail for o in failed)
                )

    async def rollbacks(self, status: ExperimentStatus, probes: ProbeChecker | None) -> bool:
        """Run the experiment's rollbacks if its strategy says so (skipped ones are journaled).

        Args:
            status: how the run ended so far.
            probes: runs ``probe`` rollbacks (None: the job was never opened; they fail).

        Returns:
            True when every rollback that ran succeeded. Never raises: a failure (or a
            second interrupt) is journaled and logged, and the other rollbacks still run.
        """
        experiment = self._ctx.experiment
        strategy = experiment.rollback_strategy
        if not experiment.rollbacks:
            return True
        met_before = self._ctx.journal.steady_state_before.met
        if not rollbacks_run(strategy, status, met_before=met_before):
            for activity in experiment.rollbacks:
                self._ctx.writer.skipped(
                    activity.name,
                    activity.type,
                    "rollbacks",
                    f"rollback_strategy {strategy!r} and status {status!r}",
                )
            return True
        self._ctx.reporter.event("rollbacks")
        ok = True
        for activity in experiment.rollbacks:
            # FC-13: one rollback's failure (or a second interrupt) never skips the others.
            try:
                if isinstance(activity, RevertActivity):
                    ok = await self._revert(activity) and ok
                elif isinstance(activity, ProbeActivity):
                    if probes is None:
                        raise ChaosError("no job to probe: the job was never opened")
                    outcome = await probes.activity(activity, "rollbacks")
                    ok = ok and outcome.ok
                else:
                    await pause(self._ctx, activity, "rollbacks")
            except asyncio.CancelledError:
                uncancel()
                ok = False
            except Exception:  # FC-13: a failing rollback is reported, the rest still run
                logger.exception("rollback %s failed", activity.name)
                ok = False
        return ok

    async def cleanup(self, status: ExperimentStatus) -> bool:
        """Revert whatever of this run is still open (the safety net; always runs, never raises).

        Returns:
            True when nothing of this run is left open.
        """
        if not self._faults.open_faults():
            return True
        reason = "abort" if status == "aborted" else "end of experiment"
        experiment_id = self._faults.experiment_id
        try:
            return await self._revert_open("revert-open-faults", "cleanup", reason, experiment_id)
        except asyncio.CancelledError:  # only without run_experiment's signal handling
            uncancel()
            return False
        except Exception:
            logger.exception("reverting the faults of %s failed", experiment_id)
            return False

    async def _revert(self, activity: RevertActivity) -> bool:
        scope = None if activity.scope == "all" else self._faults.experiment_id
        return await self._revert_open(
            activity.name, "rollbacks", f"rollback {activity.name}", scope
        )

    async def _revert_open(
        self, name: str, phase: Phase, reason: str, experiment_id: str | None
    ) -> bool:
        """Journal one revert of the open faults (of ``experiment_id``; all when None), then
        return their nodes to service (:meth:`_return_to_service`)."""
        ctx = self._ctx
        failed: list[RevertOutcome] = []
        async with ctx.writer.activity(name, "revert", phase, raise_on_failure=False) as record:
            outcomes = await self._reverter.revert_open(reason=reason, experiment_id=experiment_id)
            record.output = [
                {"fault_id": o.fault_id, "ok": o.ok, "detail": o.detail} for o in outcomes
            ]
            failed = [o for o in outcomes if not o.ok]
            ctx.annotations.reverts(outcomes, reason)
            ctx.reporter.event(
                f"  {name}: reverted {len(outcomes) - len(failed)}/{len(outcomes)} "
                + ("fault" if len(outcomes) == 1 else "faults")
            )
            if failed:
                record.status = "failed"
                record.error = "; ".join(f"{o.fault_id}: {o.detail}" for o in failed)
                ctx.reporter.event(
                    f"could NOT revert: {record.error} (still open in the "
                    "ledger; `stormwatch chaos revert --all`)"
                )
        returned = await self._return_to_service(phase)
        return not failed and record.status != "failed" and returned

    async def _return_to_service(self, phase: Phase) -> bool:
        """Have the platform return the nodes of this run's faults closed since the last
        call (here or by their TTL reaper) to service, if the scheduler took them out since
        the first was injected; journaled (``return-nodes-to-service``, one output row per
        node) unless every node was in service. Never raises.

        Returns:
            False when a node could not be returned (the record says which and why).
        """
        if self._nodes is None:
            return True
        entries = [e for e in self._faults.entries() if not e.open and e.id not in self._returned]
        self._returned.update(e.id for e in entries)
        nodes = sorted({node for entry in entries for node in _fault_nodes(entry)})
        if not nodes:
            return True
        since = min(entry.injected_at or entry.recorded_at for entry in entries)
        ctx = self._ctx
        name = "return-nodes-to-service"
        started = time.time()
        returns = await asyncio.to_thread(self._nodes.return_to_service, nodes, since=since)
        if all(r.action == "in service" for r in returns):
            logger.info("after the revert, nodes %s were in service", ", ".join(nodes))
            return True  # nothing to journal: the platform did nothing and saw nothing amiss
        async with ctx.writer.activity(name, "resume", phase, raise_on_failure=False) as record:
            record.start = started
            record.output = [dataclasses.asdict(r) for r in returns]
            acted = [r for r in returns if r.action != "in service"]
            for r in acted:
                ctx.reporter.event(f"  {name}: {r.node} {r.action}: {r.detail}")
            failed = [r for r in returns if r.action == "failed"]
            if failed:
                record.status = "failed"
                record.error = "; ".join(f"{r.node}: {r.detail}" for r in failed)
        return record.status != "failed"


def _fault_nodes(entry: LedgerEntry) -> set[str]:
    """The nodes a fault acted on: its agent-side parts' nodes, else the rank's node."""
    nodes = {part.node for part in entry.target.requests}
    if not nodes and entry.target.node is not None:
        nodes.add(entry.target.node)
    return nodes


__all__ = ["LedgerReverter", "Reverter", "RollbackExecutor", "rollbacks_run"]
