"""Human progress lines of ``stormwatch train`` on stderr (rank 0 only).

The JSON-lines events, metrics and spans are for machines; these few lines are
for the person who started the run: a start line (world size, mesh, fresh or
resumed, checkpoint folder), one line every ``every`` steps and at the last
step (step, global mean loss, step time, tokens/s over all data-parallel
ranks), one per evaluation pass (its loss and time), and a final line saying where the outputs are. The CLI gives a
:class:`ConsoleProgress` to rank 0 only; ``--quiet`` silences the progress
lines but never the warning that nothing was trained.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from stormwatch.trainer.config import DEFAULT_LOG_EVERY, ProgressConfig


class ConsoleProgress:
    """Writes progress lines to a text stream (default: ``sys.stderr`` at write time).

    Args:
        every: a step line every ``every`` steps, and at the last step.
        quiet: write nothing but warnings.
        stream: where to write; ``None`` looks up ``sys.stderr`` on each write.

    Raises:
        ConfigError: ``every`` is not an integer >= 1.
    """

    def __init__(
        self, *, every: int = DEFAULT_LOG_EVERY, quiet: bool = False, stream: TextIO | None = None
    ) -> None:
        config = ProgressConfig(every=every, quiet=quiet)  # checks every
        self.every = config.every
        self.quiet = config.quiet
        self._stream = stream
        self._started = time.monotonic()
        self._first_step: int | None = None

    def _write(self, line: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        print(f"train: {line}", file=stream, flush=True)

    def start(
        self,
        *,
        world_size: int,
        mesh: Sequence[tuple[str, int]],
        resumed_from_step: int | None,
        steps: int,
        checkpoint_dir: Path | None,
        startup_seconds: float | None = None,
    ) -> None:
        """The run is set up (after resume); ``steps`` is the last step to run.

        ``mesh`` is ``(dimension, degree)`` outermost first, e.g.
        ``ParallelDims.mesh_degrees`` (``(("pp", 2), ("dp_shard", 2), ("tp", 1))``);
        ``startup_seconds``: from this process's start to now (given: the line says
        "(ready N s after start)"; :class:`~stormwatch.trainer.startup.StartupTimeline`).
        """
        self._started = time.monotonic()
        if self.quiet:
            return
        origin = (
            "fresh start" if resumed_from_step is None else f"resumed from step {resumed_from_step}"
        )
        checkpoints = "off" if checkpoint_dir is None else str(checkpoint_dir)
        ready = "" if startup_seconds is None else f" (ready {startup_seconds:.1f} s after start)"
        self._write(
            f"world size {world_size}, mesh {' x '.join(f'{n}={d}' for n, d in mesh)}, {origin}"
            f"{ready}, training to step {steps}; checkpoints: {checkpoints}"
        )

    def step(self, *, step: int, last_step: int, loss: float, seconds: float, tokens: int) -> None:
        """Step ``step`` finished in ``seconds``; ``tokens`` over all data-parallel ranks."""
        if self._first_step is None:
            self._first_step = step
        if self.quiet or (step % self.every and step != last_step):
            return
        rate = tokens / seconds if seconds > 0 else float("inf")
        self._write(
            f"step {step}/{last_step}  loss {loss:.4f}  {seconds * 1000:.1f} ms/step  "
            f"{rate:,.0f} tokens/s"
        )

    def eval(self, *, step: int, loss: float, batches: int, seconds: float) -> None:
        """An evaluation pass after ``step`` took ``seconds`` over ``batches`` micro-batches
        per data-parallel rank; ``loss`` is its mean over every data-parallel rank."""
        if self.quiet:
            return
        self._write(
            f"eval after step {step}: loss {loss:.4f} over {batches} batches per rank "
            f"in {seconds:.1f} s"
        )

    def nothing_to_do(
        self, *, checkpoint_step: int, steps: int, checkpoint_dir: Path | None
    ) -> None:
        """Warn (even when quiet): the resumed checkpoint is already at or past ``steps``."""
        where = "past" if checkpoint_step > steps else "already at"
        self._write(
            f"warning: the latest checkpoint in {checkpoint_dir} is at step {checkpoint_step}, "
            f"{where} --steps {steps}: nothing was trained (pass --steps above "
            f"{checkpoint_step} to train further, or another --checkpoint-dir)"
        )

    def done(
        self,
        *,
        last_step: int,
        checkpoint_dir: Path | None,
        log_dir: Path | None,
        metrics_dir: Path | None,
    ) -> None:
        """Training ended normally at ``last_step``."""
        if self.quiet:
            return
        elapsed = time.monotonic() - self._started
        if self._first_step is None:
            ran = "0 steps"
        else:
            ran = f"{last_step - self._first_step + 1} steps ({self._first_step}..{last_step})"
        outputs = [
            f"{name}: {path}"
            for name, path in (
                ("checkpoints", checkpoint_dir),
                ("logs", log_dir),
                ("metrics", metrics_dir),
            )
            if path is not None
        ]
        self._write(
            f"done, {ran} in {elapsed:.1f} s; "
            + (
                "; ".join(outputs)
                if outputs
                else "no outputs written (no --checkpoint-dir, --log-dir or --metrics-dir)"
            )
        )


__all__ = ["ConsoleProgress"]
