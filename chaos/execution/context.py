"""What the collaborators of one experiment run share, passed to each through its constructor.

:class:`RunContext` names the run (experiment, id) and the three outlets every
collaborator writes to: the journal (:class:`~.journal.JournalWriter`), the progress
output (:class:`~.reporter.Reporter`) and the Grafana annotations
(:class:`RunAnnotations`). Nothing in it changes during the run; each collaborator
keeps its own state (see :mod:`stormwatch.chaos.execution.runner` for who owns what).
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from stormwatch.chaos.execution.journal_writer import JournalWriter
from stormwatch.chaos.execution.reporter import Reporter
from stormwatch.chaos.experiment.model import Experiment, PauseActivity
from stormwatch.chaos.ledger.revert import RevertOutcome
from stormwatch.contracts.journal import Journal, Phase
from stormwatch.dashboards.annotations import Annotator


class RunAnnotations:
    """The run's Grafana annotations, each tagged ``stormwatch``, ``chaos``, ``experiment:<id>``.

    Args:
        annotator: where they go (queued: never blocks or raises).
        experiment_id: the run's id, in every annotation's tags.
    """

    def __init__(self, annotator: Annotator, experiment_id: str) -> None:
        self._annotator = annotator
        self._experiment_id = experiment_id

    def annotate(
        self, text: str, *tags: str, start: float | None = None, end: float | None = None
    ) -> None:
        """One annotation (Unix seconds; ``start`` None: now)."""
        self._annotator.annotate(
            text,
            ("stormwatch", "chaos", f"experiment:{self._experiment_id}", *tags),
            start=start,
            end=end,
        )

    def reverts(self, outcomes: list[RevertOutcome], reason: str) -> None:
        """One annotation per revert outcome: ``fault-reverted`` or ``fault-revert-failed``."""
        for outcome in outcomes:
            verb = "reverted" if outcome.ok else "NOT reverted"
            self.annotate(
                f"fault {outcome.fault_id} {verb} ({reason}): {outcome.detail}",
                "fault-reverted" if outcome.ok else "fault-revert-failed",
            )

    async def close(self) -> None:
        """Wait (bounded, in a thread) for the queued annotations to be posted."""
        await asyncio.to_thread(self._annotator.close)


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """The run every collaborator works for, and where each says what it did.

    Attributes:
        experiment: the validated experiment.
        experiment_id: the run's id (folder name, fault-id prefix, annotation tag).
        writer: the journal (one record per activity; rewritten after each).
        reporter: progress output.
        annotations: Grafana annotations of the run.
    """

    experiment: Experiment
    experiment_id: str
    writer: JournalWriter
    reporter: Reporter
    annotations: RunAnnotations

    @property
    def journal(self) -> Journal:
        """The journal being written."""
        return self.writer.journal


async def pause(ctx: RunContext, activity: PauseActivity, phase: Phase) -> None:
    """Run a ``pause`` activity of the method or the rollbacks: sleep, journaled."""
    async with ctx.writer.activity(activity.name, "pause", phase) as record:
        ctx.reporter.status(f"{activity.name}: pausing {activity.seconds:g} s")
        await asyncio.sleep(activity.seconds)
        record.output = {"seconds": activity.seconds}


def uncancel() -> None:
    """Clear the current task's pending-cancel count so cleanup can await normally (Python >= 3.11)."""
    task = asyncio.current_task()
    if task is not None and sys.version_info >= (3, 11):
        while task.cancelling():
            task.uncancel()


__all__ = ["RunAnnotations", "RunContext", "pause", "uncancel"]
