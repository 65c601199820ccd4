"""One optimizer step's forward and backward passes over its micro-batches.

Gradient accumulation (constant global batch, :mod:`stormwatch.trainer.data.batches`):
FSDP2 reduce-scatters only after the last micro-batch, and each loss is scaled
by ``1/A`` so that the gradient is that of the mean over the global batch
(``A == 1``: exactly the unscaled loss, bitwise). With pipeline parallelism the
schedule runs forward and backward of each micro-batch and syncs the gradients
itself. Dropout is re-seeded before each micro-batch
(:attr:`~stormwatch.trainer.data.batches.MicroBatch.dropout_seed`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule

import stormwatch.telemetry as swt
from stormwatch.trainer.config import VOCAB_SIZE
from stormwatch.trainer.data.batches import MicroBatch

if TYPE_CHECKING:  # torch.distributed.pipelining (and torch._dynamo) only when pp > 1
    from stormwatch.trainer.parallel.pipeline import Pipeline


def _set_gradient_sync(model: torch.nn.Module, sync: bool) -> None:
    """FSDP2: reduce-scatter gradients in this backward (``sync``) or keep accumulating
    them unsharded (``FSDPModule.set_requires_gradient_sync``); no-op for other modules."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)


class ForwardBackward:
    """Runs the passes of one step and returns this rank's (scaled, summed) loss.

    Args:
        model: this rank's (parallelized) model or pipeline stage.
        pipeline: the stage and schedule with PP, else ``None``.
        device: where the batches go.
        accumulation: micro-batches per rank per optimizer step.
        tracing: the session whose spans ``forward`` / ``backward`` (or ``pipeline``)
            go around each micro-batch.
        before_backward: called once per step, before the first backward (the
            chaos fault points that act there: a crash, a slow rank).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        pipeline: Pipeline | None,
        *,
        device: torch.device,
        accumulation: int,
        tracing: swt.Session,
        before_backward: Callable[[], None],
    ) -> None:
        self._model = model
        self._pipeline = pipeline
        self._device = device
        self._accumulation = accumulation
        self._tracing = tracing
        self._before_backward = before_backward

    def run(self, micro_batches: Sequence[MicroBatch]) -> torch.Tensor:
        """Forward and backward of every micro-batch; the local loss (detached).

        With PP only the last stage's loss is non-zero (see
        :mod:`stormwatch.trainer.parallel.pipeline`).
        """
        local_loss: torch.Tensor | None = None
        for j, micro in enumerate(micro_batches):
            if self._accumulation > 1 and self._pipeline is None:  # PP: the schedule syncs
                _set_gradient_sync(self._model, j == self._accumulation - 1)
            torch.manual_seed(micro.dropout_seed)
            if self._pipeline is not None:
                detached = self._pipelined(self._pipeline, micro, first=j == 0)
                local_loss = detached if local_loss is None else local_loss + detached
                continue
            detached = self._forward_backward(micro, first=j == 0)
            local_loss = detached.clone() if local_loss is None else local_loss + detached
        assert local_loss is not None
        return local_loss

    def _pipelined(self, pipeline: Pipeline, micro: MicroBatch, *, first: bool) -> torch.Tensor:
        if first:
            self._before_backward()
        with self._tracing.span("pipeline", micro_batch=micro.index):
            return pipeline.forward_backward(
                micro.inputs.to(self._device), micro.targets.to(self._device)
            )

    def _forward_backward(self, micro: MicroBatch, *, first: bool) -> torch.Tensor:
        with self._tracing.span("forward", micro_batch=micro.index):
            logits = self._model(micro.inputs.to(self._device))
            loss = F.cross_entropy(
                logits.reshape(-1, VOCAB_SIZE), micro.targets.to(self._device).reshape(-1)
            )
            if self._accumulation > 1:  # A == 1: exactly the unscaled loss (bitwise)
                loss = loss / self._accumulation
        with self._tracing.span("backward", micro_batch=micro.index):
            if first:
                self._before_backward()
            loss.backward()
        return loss.detach()


__all__ = ["ForwardBackward"]
