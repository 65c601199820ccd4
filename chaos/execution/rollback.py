"""Rollbacks and the final revert of an experiment's faults (FC-13). Part of
:class:`stormwatch.chaos.execution.runner.Runner` (a mixin)."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING

from stormwatch.chaos.execution.journal import ExperimentStatus, Phase
from stormwatch.chaos.experiment.model import ProbeActivity, RevertActivity
from stormwatch.chaos.ledger.revert import RevertOutcome, revert_open

if TYPE_CHECKING:
    from stormwatch.chaos.execution.runner import Runner

logger = logging.getLogger(__name__)


class RollbackMixin:
    """The rollback half of the runner (see :class:`~stormwatch.chaos.execution.runner.Runner`)."""

    # -- rollbacks and cleanup -------------------------------------------------------------

    async def _rollbacks(self: Runner, status: ExperimentStatus) -> bool:
        strategy = self.experiment.rollback_strategy
        # chaostoolkit's runtime strategies (chaostoolkit-lib PR #179): ``default`` skips them
        # when the hypothesis failed before the method or the run was interrupted.
        run = (
            strategy == "always"
            or (strategy == "deviated" and status == "deviated")
            or (
                strategy == "default"
                and status != "aborted"
                and self.journal.steady_state_before.met is not False
            )
        )
        if not self.experiment.rollbacks:
            return True
        if not run:
            for activity in self.experiment.rollbacks:
                self._writer.skipped(
                    activity.name,
                    activity.type,
                    "rollbacks",
                    f"rollback_strategy {strategy!r} and status {status!r}",
                )
            return True
        self.reporter.event("rollbacks")
        ok = True
        for activity in self.experiment.rollbacks:
            # FC-13: one rollback's failure (or a second interrupt) never skips the others.
            try:
                if isinstance(activity, RevertActivity):
                    ok = await self._revert(activity) and ok
                elif isinstance(activity, ProbeActivity):
                    outcome = await self._probe(
                        activity.name,
                        activity.provider,
                        "rollbacks",
                        activity.timeout_seconds,
                        activity.poll_seconds,
                    )
                    ok = ok and outcome.ok
                else:
                    await self._pause(activity, "rollbacks")
            except asyncio.CancelledError:
                _uncancel()
                ok = False
            except Exception:  # FC-13: a failing rollback is reported, the rest still run
                logger.exception("rollback %s failed", activity.name)
                ok = False
        return ok

    async def _revert(self: Runner, activity: RevertActivity) -> bool:
        scope = None if activity.scope == "all" else self.experiment_id
        return await self._revert_open(
            activity.name, "rollbacks", f"rollback {activity.name}", scope
        )

    async def _cleanup(self: Runner, status: ExperimentStatus) -> bool:
        """Revert whatever of this experiment is still open (the safety net; always runs)."""
        assert self._ledger is not None
        if not self._ledger.open_faults(experiment_id=self.experiment_id):
            return True
        reason = "abort" if status == "aborted" else "end of experiment"
        try:
            return await self._revert_open(
                "revert-open-faults", "cleanup", reason, self.experiment_id
            )
        except asyncio.CancelledError:  # only without run_experiment's signal handling
            _uncancel()
            return False
        except Exception:
            logger.exception("reverting the faults of %s failed", self.experiment_id)
            return False

    async def _revert_open(
        self: Runner, name: str, phase: Phase, reason: str, experiment_id: str | None
    ) -> bool:
        """Journal one revert of the open faults (of ``experiment_id``; all when None)."""
        assert self._ledger is not None
        failed: list[RevertOutcome] = []
        async with self._writer.activity(name, "revert", phase, raise_on_failure=False) as record:
            outcomes = await revert_open(
                self._ledger, reason=reason, experiment_id=experiment_id, session=self._session
            )
            record.output = [
                {"fault_id": o.fault_id, "ok": o.ok, "detail": o.detail} for o in outcomes
            ]
            failed = [o for o in outcomes if not o.ok]
            self._annotate_reverts(outcomes, reason)
            self.reporter.event(
                f"  {name}: reverted {len(outcomes) - len(failed)}/{len(outcomes)} "
                + ("fault" if len(outcomes) == 1 else "faults")
            )
            if failed:
                record.status = "failed"
                record.error = "; ".join(f"{o.fault_id}: {o.detail}" for o in failed)
                self.reporter.event(
                    f"could NOT revert: {record.error} (still open in the "
                    "ledger; `stormwatch chaos revert --all`)"
                )
        return not failed and record.status != "failed"


def _uncancel() -> None:
    """Clear the pending-cancel count so cleanup can await normally (Python >= 3.11)."""
    task = asyncio.current_task()
    if task is not None and sys.version_info >= (3, 11):
        while task.cancelling():
            task.uncancel()


__all__ = ["RollbackMixin"]
