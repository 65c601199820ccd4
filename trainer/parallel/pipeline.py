"""Pipeline parallelism over the ``pp`` mesh dimension with ``torch.distributed.pipelining``.

The model is split by hand (no tracing): stage ``s`` of ``pp`` keeps a
contiguous slice of the transformer blocks, the first stage also the
embeddings, the last the final norm and the head (see
:mod:`stormwatch.trainer.model`). Blocks are spread as evenly as possible,
earlier stages taking one more when ``n_layers`` is not a multiple of ``pp``
(the first holds the embeddings, the last the head; both are small here).

One stage per rank, with one of two schedules from
``torch.distributed.pipelining.schedules``:

* ``1F1B`` (:class:`~torch.distributed.pipelining.schedules.Schedule1F1B`,
  the default): after a warm-up of ``pp - 1 - stage`` forwards, each stage
  alternates one forward and one backward, so at most ``pp`` micro-batches'
  activations are alive (Narayanan et al., "Efficient Large-Scale Language
  Model Training on GPU Clusters Using Megatron-LM", 2021). Needs
  ``microbatches >= pp``.
* ``GPipe`` (:class:`~torch.distributed.pipelining.schedules.ScheduleGPipe`):
  all forwards, then all backwards (Huang et al., 2019).

Interleaved 1F1B (several virtual stages per rank) is not offered: it needs
one model chunk per virtual stage, each its own FSDP unit and state-dict
prefix, which this trainer's single-module checkpoint state does not model.

Activations cross stages as plain tensors (``[microbatch, seq, d_model]``
float32) through ``c10d::send`` / ``c10d::recv_`` on the ``pp`` group, which
gloo implements on CPU; :class:`~stormwatch.telemetry.comms.CollectiveCounter`
counts them as ``send`` / ``recv`` with ``mesh_dim="pp"``. Shapes are given
to :class:`~torch.distributed.pipelining.PipelineStage` up front (static
mode), so no shape-inference messages are exchanged at the first step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleGPipe,
)

from stormwatch.trainer.config import VOCAB_SIZE
from stormwatch.trainer.model import ByteLM

#: ``--pp-schedule`` value -> schedule class.
SCHEDULES: dict[str, type[PipelineScheduleSingle]] = {
    "1F1B": Schedule1F1B,
    "GPipe": ScheduleGPipe,
}

#: ``loss_fn(output, target) -> scalar``: run by the schedule on the last stage per micro-batch.
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def stage_layers(n_layers: int, stage: int, stages: int) -> range:
    """Indices of the blocks stage ``stage`` of ``stages`` holds (contiguous, balanced).

    Raises:
        ValueError: ``stages > n_layers`` (a stage without blocks) or ``stage``
            outside ``[0, stages)``.
    """
    if not 0 <= stage < stages or stages > n_layers:
        raise ValueError(f"stage {stage} of {stages} cannot hold a block of {n_layers}")
    base, extra = divmod(n_layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def split_stage(model: ByteLM, stage: int, stages: int) -> ByteLM:
    """Keep only stage ``stage``'s modules in ``model`` (in place) and return it.

    Blocks keep their original ``layers.<i>`` keys, so parameter names are
    globally unique across stages and equal to the unsplit model's.
    """
    keep = {str(i) for i in stage_layers(len(model.layers), stage, stages)}
    for key in list(model.layers.keys()):
        if key not in keep:
            del model.layers[key]
    if stage != 0:
        model.tok_emb = None
        model.pos_emb = None
    if stage != stages - 1:
        model.norm = None
        model.head = None
    return model


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy of logits ``[B, T, 256]`` against targets ``[B, T]``."""
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB_SIZE), targets.reshape(-1))


@dataclass(frozen=True)
class Pipeline:
    """This rank's stage and the schedule that drives it.

    Attributes:
        schedule: call ``schedule.step(tokens, target=targets, losses=[])``
            on every stage rank each step (first stage: tokens ``[B, T]``;
            last: targets ``[B, T]``; the others may pass both, unused).
        stage: index of this rank's stage.
        stages: number of stages (``pp``).
        microbatches: micro-batches per step.
    """

    schedule: PipelineScheduleSingle
    stage: int
    stages: int
    microbatches: int
    device: torch.device

    @property
    def is_first(self) -> bool:
        """True on the stage holding the embeddings."""
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        """True on the stage holding the head and computing the loss."""
        return self.stage == self.stages - 1

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Run the schedule over one batch; collective over the ``pp`` group.

        Args:
            inputs: tokens ``[B, T]`` (read on the first stage only).
            targets: next bytes ``[B, T]`` (read on the last stage only).

        Returns:
            On the last stage the sum of the micro-batch losses as the loss
            function returned them (each already divided, see
            :func:`build_pipeline`), i.e. this batch's share of the mean loss;
            elsewhere a zero scalar, so that summing over ``pp`` gives the loss.
        """
        losses: list[torch.Tensor] = []
        if self.is_first:
            self.schedule.step(inputs, return_outputs=False)
        elif self.is_last:
            self.schedule.step(target=targets, losses=losses, return_outputs=False)
        else:
            self.schedule.step(return_outputs=False)
        if not losses:
            return torch.zeros((), device=self.device)
        return torch.stack([loss.detach() for loss in losses]).sum()


def build_pipeline(
    stage_module: nn.Module,
    *,
    stage: int,
    stages: int,
    group: torch.distributed.ProcessGroup,
    device: torch.device,
    schedule: str,
    microbatches: int,
    microbatch_shape: tuple[int, int],
    d_model: int,
    accumulation_steps: int = 1,
    loss_fn: LossFn = cross_entropy,
) -> Pipeline:
    """Wrap ``stage_module`` (already TP/FSDP-parallelized) in a stage and a schedule.

    Args:
        stage_module: this stage's part of the model (:func:`split_stage`).
        stage: this rank's stage index (its ``pp`` coordinate).
        stages: ``pp``.
        group: the ``pp`` process group (point-to-point transfers).
        device: where activations live.
        schedule: a key of :data:`SCHEDULES`.
        microbatches: micro-batches per step; the schedule splits the batch
            along dimension 0, so it must divide the batch size.
        microbatch_shape: ``(sequences, seq_len)`` of one micro-batch.
        d_model: width of the activations sent between stages.
        accumulation_steps: gradient-accumulation steps per optimizer step
            (the schedule runs once per accumulation step).
        loss_fn: per micro-batch mean loss on the last stage. The schedule
            back-propagates ``loss_fn(...) / (microbatches * accumulation_steps)``
            and does not rescale gradients afterwards (``scale_grads=False``:
            its rescaling would also divide the gradients accumulated by
            earlier accumulation steps), so the step's gradient is that of the
            mean loss over the step's batch, as without pipelining.

    Raises:
        KeyError: unknown schedule name.
        ValueError: the schedule rejects ``microbatches`` (1F1B needs ``>= stages``).
    """
    sequences, seq_len = microbatch_shape
    # requires_grad: the stage sends the gradient of its input back (not for tokens).
    hidden = torch.empty(sequences, seq_len, d_model, device=device, requires_grad=True)
    tokens = torch.empty(sequences, seq_len, dtype=torch.long, device=device)
    logits = torch.empty(sequences, seq_len, VOCAB_SIZE, device=device)
    pipeline_stage = PipelineStage(
        stage_module,
        stage,
        stages,
        device,
        input_args=(tokens if stage == 0 else hidden,),
        output_args=(logits if stage == stages - 1 else hidden,),
        group=group,
    )
    divisor = microbatches * accumulation_steps

    def scaled_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_fn(output, target) / divisor

    driver = SCHEDULES[schedule](
        pipeline_stage, n_microbatches=microbatches, loss_fn=scaled_loss, scale_grads=False
    )
    return Pipeline(
        schedule=driver, stage=stage, stages=stages, microbatches=microbatches, device=device
    )


__all__ = [
    "SCHEDULES",
    "LossFn",
    "Pipeline",
    "build_pipeline",
    "cross_entropy",
    "split_stage",
    "stage_layers",
]
