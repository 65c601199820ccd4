"""When the training loop saves and commits checkpoints.

A save follows every ``every``-th step, the last step, and a step at which any
rank asked for one (a chaos ``checkpoint_now`` request, agreed through the
gradient-norm all-reduce). In async mode a save is written and committed on the
checkpointer's writer thread; the loop records the commit once every rank's save
has ended (also agreed through that all-reduce), or before the next save, or at
the end of training. Every save and commit runs through the
:class:`~stormwatch.trainer.checkpoint.budget.FailureBudget` (a failed one is
counted, too many in a row stop the job) inside a ``checkpoint_save`` /
``checkpoint_commit`` span. In async mode the loop also waits, before its next
optimizer step, for a save's copy of the state when it has not ended yet (a
``checkpoint_copy`` span, only then): the loop's blocking time per async save is
``checkpoint_save`` + ``checkpoint_copy`` + ``checkpoint_commit``.

Saves and commits are a ``checkpoint_save`` phase (:func:`stormwatch.telemetry.phase`)
with a bound that follows this run's own saves: :data:`SAVE_BOUND_FACTOR` x the longest
save or commit so far, at least :data:`SAVE_BOUND_FLOOR_S`. The hang threshold outside
phases is only max(5 s, 3 x median step) (issue 18), which a large model's write to a
parallel file system exceeds (minutes, with no collective completing); and a rank frozen
in the middle of a save must still be found within seconds of its usual save time, as
the chaos suite's freeze experiments expect, not after the phase's default bound
(15 minutes).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator

import stormwatch.telemetry as swt
from stormwatch.trainer.checkpoint.budget import FailureBudget
from stormwatch.trainer.checkpoint.checkpointer import Checkpointer

#: Smallest bound of a save's ``checkpoint_save`` phase, seconds: a first save (nothing
#: measured yet) of the lab's models takes under a second; 30 s is the hang floor before
#: issue 18, which saves had always fitted in.
SAVE_BOUND_FLOOR_S = 30.0
#: The bound as a multiple of the longest save or commit so far (3: the hang factor).
SAVE_BOUND_FACTOR = 3.0


class CheckpointCadence:
    """Decides after each step whether to commit and whether to save; collective.

    Args:
        checkpointer: does the saving and committing.
        budget: failed saves in a row the job trains through.
        tracing: the session whose spans go around saves and commits.

    Attributes:
        last_save_started: wall time (s) the last save started, ``None`` before
            the first (a chaos checkpoint request compares its time with it).
    """

    def __init__(
        self, checkpointer: Checkpointer, budget: FailureBudget, tracing: swt.Session
    ) -> None:
        self._checkpointer = checkpointer
        self._budget = budget
        self._tracing = tracing
        self.last_save_started: float | None = None
        self._longest = 0.0  # the longest save or commit so far, seconds

    @contextlib.contextmanager
    def _phase(self) -> Iterator[None]:
        """The ``checkpoint_save`` phase around a save or commit; measures it."""
        bound = max(SAVE_BOUND_FLOOR_S, SAVE_BOUND_FACTOR * self._longest)
        started = time.monotonic()
        with swt.phase("checkpoint_save", bound_seconds=bound):
            try:
                yield
            finally:
                self._longest = max(self._longest, time.monotonic() - started)

    def commit_written(self, step: int, *, every_rank_written: bool) -> None:
        """Record the async save in flight once every rank's save has ended (committed or failed)."""
        if not every_rank_written:
            return
        pending = self._checkpointer.pending_step
        with self._tracing.span("checkpoint_commit", step=pending), self._phase():
            self._budget.run(pending or step, self._checkpointer.finish)

    def before_update(self) -> None:
        """Before the optimizer changes the parameters in place: wait for the async save's
        copy of the state, if it is still running (a ``checkpoint_copy`` span of its step)."""
        if not self._checkpointer.copy_pending():
            return
        pending = self._checkpointer.pending_step
        with self._tracing.span("checkpoint_copy", step=pending), self._phase():
            self._checkpointer.wait_for_copy()

    def save_if_due(self, step: int, *, last_step: int, requested: bool) -> None:
        """Save after ``step`` when it is due, the last one, or ``requested`` by any rank."""
        if not (self._checkpointer.due(step) or step == last_step or requested):
            return
        self.last_save_started = time.time()
        self.commit_pending()  # async: commit (or count the failure of) the last one
        with self._tracing.span("checkpoint_save", step=step), self._phase():
            self._budget.run(step, functools.partial(self._checkpointer.save, step))

    def commit_pending(self) -> None:
        """Wait for the async save in flight, if any, and record it (before a save, at the end)."""
        pending = self._checkpointer.pending_step
        if pending is None:
            return
        with self._tracing.span("checkpoint_commit", step=pending), self._phase():
            self._budget.run(pending, self._checkpointer.finish)


__all__ = ["SAVE_BOUND_FACTOR", "SAVE_BOUND_FLOOR_S", "CheckpointCadence"]
