"""Test-only fault points, set by environment and read once at the CLI edge.

* ``STORMWATCH_FAULT_EXIT_AT_STEP=k``: SIGKILL the rank at the start of step
  ``k`` (before its batch is drawn), so steps up to ``k - 1`` are complete.
  Fires only when ``TORCHELASTIC_RESTART_COUNT`` is 0, so a run under
  ``torchrun --max-restarts 1`` crashes once and then resumes.
* ``STORMWATCH_FAULT_SLOW_SECONDS=s``: sleep ``s`` seconds before every
  backward pass (a compute straggler, FC-14), in every attempt. Sleeping
  changes no number, only timing.
* ``STORMWATCH_FAULT_CHECKPOINT_KILL=phase@k``: SIGKILL the rank at
  ``phase`` of the save of step ``k`` (``before_shards``: before this rank
  writes its shard files; ``before_metadata``: on rank 0, after every shard
  and before ``.metadata``; ``before_marker``: on rank 0, before the
  completion marker). In async mode the first two fire on the writer
  thread while training goes on. Only when ``TORCHELASTIC_RESTART_COUNT`` is 0.
* ``STORMWATCH_FAULT_RANK=r``: apply the faults above to rank ``r`` only
  (default: every rank).

They exist to test crash-resume determinism, dead-rank telemetry and
straggler attribution; chaos experiments act from outside (the agent's fault
API) instead. No torch import here.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass

from stormwatch.errors import ConfigError

log = logging.getLogger(__name__)

ENV_EXIT_STEP = "STORMWATCH_FAULT_EXIT_AT_STEP"
ENV_SLOW_SECONDS = "STORMWATCH_FAULT_SLOW_SECONDS"
ENV_RANK = "STORMWATCH_FAULT_RANK"
ENV_CHECKPOINT_KILL = "STORMWATCH_FAULT_CHECKPOINT_KILL"
_PHASES = ("before_shards", "before_metadata", "before_marker")


@dataclass(frozen=True, kw_only=True)
class FaultPoint:
    """The faults that apply to this process.

    Attributes:
        exit_at_step: step at whose start the process SIGKILLs itself, or ``None``.
        slow_seconds: seconds slept before each backward pass (0: none).
    """

    exit_at_step: int | None = None
    slow_seconds: float = 0.0
    checkpoint_kill: tuple[str, int] | None = None

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str], *, rank: int, attempt: int
    ) -> FaultPoint | None:
        """The faults for this rank and attempt, or ``None`` when none applies.

        Raises:
            ConfigError: a variable is set to a value of the wrong kind.
        """
        raw_step = environ.get(ENV_EXIT_STEP, "")
        raw_slow = environ.get(ENV_SLOW_SECONDS, "")
        raw_rank = environ.get(ENV_RANK, "")
        raw_kill = environ.get(ENV_CHECKPOINT_KILL, "")
        if not raw_step and not raw_slow and not raw_kill:
            return None
        kill: tuple[str, int] | None = None
        if raw_kill:
            phase, _, at = raw_kill.partition("@")
            if phase not in _PHASES or not at.isdigit() or int(at) < 1:
                raise ConfigError(
                    f"environment {ENV_CHECKPOINT_KILL}={raw_kill!r}: must be PHASE@STEP with "
                    f"PHASE one of {', '.join(_PHASES)} and STEP >= 1"
                )
            kill = (phase, int(at))
        try:
            step = int(raw_step) if raw_step else None
            slow = float(raw_slow) if raw_slow else 0.0
            only_rank = int(raw_rank) if raw_rank else None
        except ValueError:
            raise ConfigError(
                f"environment {ENV_EXIT_STEP}={raw_step!r}, {ENV_SLOW_SECONDS}={raw_slow!r}, "
                f"{ENV_RANK}={raw_rank!r}: must be an integer, a number of seconds, an integer"
            ) from None
        if (step is not None and step < 1) or not (math.isfinite(slow) and slow >= 0):
            raise ConfigError(f"environment {ENV_EXIT_STEP} must be >= 1, {ENV_SLOW_SECONDS} >= 0")
        if only_rank is not None and only_rank < 0:
            raise ConfigError(f"environment {ENV_RANK} must be >= 0 (got {only_rank})")
        if only_rank is not None and only_rank != rank:
            return None
        fault = cls(
            exit_at_step=step if attempt == 0 else None,
            slow_seconds=slow,
            checkpoint_kill=kill if attempt == 0 else None,
        )
        active = fault.exit_at_step is not None or fault.slow_seconds > 0
        return fault if active or fault.checkpoint_kill is not None else None

    def check(self, step: int) -> None:
        """SIGKILL this process if ``step`` is the exit step."""
        if step == self.exit_at_step:
            log.warning("fault point: SIGKILL at the start of step %d (pid %d)", step, os.getpid())
            os.kill(os.getpid(), signal.SIGKILL)

    def checkpoint_phase(self, phase: str, step: int) -> None:
        """SIGKILL this process if ``(phase, step)`` is the armed checkpoint phase."""
        if self.checkpoint_kill == (phase, step):
            log.warning("fault point: SIGKILL at %s of the save of step %d", phase, step)
            os.kill(os.getpid(), signal.SIGKILL)

    def before_backward(self) -> None:
        """Sleep :attr:`slow_seconds` (the straggler fault)."""
        if self.slow_seconds > 0:
            time.sleep(self.slow_seconds)


__all__ = ["ENV_CHECKPOINT_KILL", "ENV_EXIT_STEP", "ENV_RANK", "ENV_SLOW_SECONDS", "FaultPoint"]
