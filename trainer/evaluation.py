"""Evaluation passes: forward only, over held-out batches, marked as the telemetry phase ``eval``.

With ``--eval-every N`` the step loop (:class:`~stormwatch.trainer.steps.StepLoop`) calls
:meth:`Evaluator.run` after every ``N``-th step, once that step's checkpoint (if due) is
saved. A pass, collective on every rank:

1. enters the phase ``eval`` (:func:`stormwatch.telemetry.phase`; bound 30 minutes,
   :mod:`stormwatch.telemetry.phases`): the agent and the alert rules do not call the rank
   hung while it evaluates, however long the pass pauses its steps;
2. switches the model to ``eval()`` (dropout off) and runs it forward under
   ``torch.no_grad()`` over this rank's ``--eval-batches`` held-out micro-batches
   (:meth:`~stormwatch.trainer.data.batches.BatchSampler.held_out`, built once), sleeping
   ``--eval-delay`` seconds after each (a lab's stand-in for a long evaluation);
3. averages the loss over the data-parallel ranks
   (:func:`~stormwatch.trainer.instrument.global_mean_loss`), logs it (rank 0's progress
   line ``eval after step N: loss ...``), and switches the model back to ``train()``.

Why training is unaffected (a resumed run's losses stay bitwise those of an uninterrupted
one, with or without evaluation): the held-out batches are a stream of their own, read
without advancing the sampler (nothing in a checkpoint changes); no gradient is made and
the optimizer is not touched; the random generators (CPU, and the current CUDA device's)
are saved before the pass and restored after it (``torch.random.fork_rng``), though
dropout, the only consumer, is off; and every training micro-batch re-seeds them anyway.

Not with pipeline parallelism (a stage does not hold the whole model): ``TrainConfig``
refuses ``--eval-every`` with ``--pp`` > 1.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import stormwatch.telemetry as swt
from stormwatch.trainer.config import VOCAB_SIZE, EvalConfig
from stormwatch.trainer.data.batches import BatchSampler
from stormwatch.trainer.instrument import global_mean_loss
from stormwatch.trainer.parallel.dims import ParallelDims
from stormwatch.trainer.progress import ConsoleProgress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalResult:
    """One evaluation pass.

    Attributes:
        step: the step it followed.
        loss: mean cross-entropy over the held-out batches of every data-parallel rank.
        batches: micro-batches this rank evaluated.
        seconds: the pass's wall time on this rank (delays included).
    """

    step: int
    loss: float
    batches: int
    seconds: float


class Evaluator:
    """Runs the evaluation passes of a run (module docstring); collective.

    Args:
        config: how often, how many batches, the delay after each.
        dims: the degrees (the loss is averaged over the data-parallel ones).
        model: this rank's parallelized model (the whole model: pp is 1).
        sampler: gives this rank's held-out micro-batches (read once, here).
        device: where the batches go.
        session: the telemetry session whose phase ``eval`` (and span) marks each pass.
        progress: rank 0's progress lines, else ``None``.
    """

    def __init__(
        self,
        config: EvalConfig,
        dims: ParallelDims,
        *,
        model: torch.nn.Module,
        sampler: BatchSampler,
        device: torch.device,
        session: swt.Session,
        progress: ConsoleProgress | None = None,
    ) -> None:
        self._config = config
        self._dims = dims
        self._model = model
        self._device = device
        self._session = session
        self._progress = progress
        self._batches = sampler.held_out(config.batches)

    def due(self, step: int) -> bool:
        """Whether a pass follows ``step`` (every ``config.every``-th step)."""
        return self._config.every > 0 and step % self._config.every == 0

    def run(self, step: int) -> EvalResult:
        """One pass after ``step``, inside the phase ``eval``; returns (and logs) its loss."""
        started = time.perf_counter()
        with self._session.phase("eval"), self._session.span("eval", step=step):
            local = self._forward_only()
            loss = global_mean_loss(local, self._dims)
        result = EvalResult(
            step=step,
            loss=loss,
            batches=len(self._batches),
            seconds=time.perf_counter() - started,
        )
        log.info(
            "eval after step %d: loss %.6f over %d batches in %.2f s",
            step,
            loss,
            result.batches,
            result.seconds,
        )
        if self._progress is not None:
            self._progress.eval(
                step=step, loss=loss, batches=result.batches, seconds=result.seconds
            )
        return result

    def _forward_only(self) -> torch.Tensor:
        """This rank's mean loss over its held-out batches; the model is in ``train()`` after,
        and the random generators are as they were."""
        devices = [self._device] if self._device.type == "cuda" else []
        total = torch.zeros((), device=self._device)
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            self._model.eval()
            try:
                for micro in self._batches:
                    logits = self._model(micro.inputs.to(self._device))
                    total += F.cross_entropy(
                        logits.reshape(-1, VOCAB_SIZE), micro.targets.to(self._device).reshape(-1)
                    )
                    if self._config.delay > 0:
                        time.sleep(self._config.delay)
            finally:
                self._model.train()
        return total / len(self._batches)


__all__ = ["EvalResult", "Evaluator"]
