"""How many failed checkpoint saves in a row a job trains through (``--checkpoint-failures-allowed``).

A save that fails (a full or read-only disk, an I/O error) costs the job its
checkpoint, not its run: the failure is counted
(``stormwatch_train_checkpoint_failures_total``, a ``checkpoint_failed`` event,
alert ``StormwatchCheckpointFailing``), the partial folder is left for the next
scan to ignore and prune, and training goes on. Too many in a row and the job
stops with the last error, rather than train on for hours with nothing to
resume from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch.distributed.checkpoint.api import CheckpointException

from stormwatch.telemetry import rank_failures
from stormwatch.trainer.errors import CheckpointError

log = logging.getLogger(__name__)

#: What a failed DCP save or load raises: DCP's own CheckpointException derives from BaseException
#: (torch.distributed.checkpoint.api), so ``except Exception`` alone lets it through.
DCP_ERRORS = (Exception, CheckpointException)


def describe_dcp_error(exc: BaseException, *, ranks: bool = True) -> str:
    """One line for a DCP failure: each failing rank's own exception (a
    CheckpointException's text is every rank's whole traceback), prefixed with
    ``rank R:`` unless ``ranks`` is False."""
    return "; ".join(
        f"{f'rank {rank}: ' if ranks and rank is not None else ''}{type(inner).__name__}: {inner}"
        for rank, inner in rank_failures(exc)
    )


class FailureBudget:
    """Trains through up to ``allowed`` failed saves in a row (a full or read-only disk,
    an I/O error): the job loses only the checkpoint, not the run; one failure more
    raises. A committed save resets the count.

    Args:
        allowed: failed saves in a row that are tolerated (``CheckpointConfig.failures_allowed``).
        on_failure: ``on_failure(step, error)`` for every failed save (metrics, events).
    """

    def __init__(self, allowed: int, on_failure: Callable[[int, str], None]) -> None:
        self.allowed = allowed
        self.in_a_row = 0
        self._on_failure = on_failure

    def run(self, step: int, action: Callable[[], object]) -> None:
        """Run the collective save or commit ``action`` for ``step``.

        Raises:
            CheckpointError: it failed and the budget is spent (on every rank alike:
                the error is collective).
        """
        try:
            action()
        except CheckpointError as exc:
            self.in_a_row += 1
            self._on_failure(step, str(exc))
            if self.in_a_row > self.allowed:
                raise CheckpointError(
                    f"{self.in_a_row} checkpoint saves in a row failed (at most "
                    f"{self.allowed} allowed: --checkpoint-failures-allowed); last: {exc}"
                ) from exc
            log.error(
                "checkpoint of step %d failed (%d in a row, %d allowed); training goes on: %s",
                step,
                self.in_a_row,
                self.allowed,
                exc,
            )

    def committed(self) -> None:
        """A save was committed: the count starts again."""
        self.in_a_row = 0


__all__ = ["DCP_ERRORS", "FailureBudget", "describe_dcp_error"]
