"""Apply pipeline, tensor and (hybrid) sharded data parallelism to a :class:`~stormwatch.trainer.model.ByteLM`.

All parallelism decisions live in :func:`parallelize`, in the order
torchtitan uses: PP split -> TP -> (activation checkpointing) -> (compile)
-> FSDP2 (HSDP when ``dp_replicate > 1``) -> pipeline schedule. Activation
checkpointing and ``torch.compile`` are not used (the model is tiny and
compile time would dominate a test run); their places are marked.

CPU / gloo (checked on torch 2.13): gloo implements what FSDP2, HSDP,
DTensor and the pipeline issue here: ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``all_reduce`` with ``ReduceOp.AVG`` (FSDP2's
default for fp32 gradients) and SUM, ``send`` / ``recv``. It does not
implement ``ReduceOp.PREMUL_SUM``, which FSDP2 would pick after
``set_gradient_divide_factor(f)`` with ``f`` != the dp size; this module
never sets a divide factor. (On a backend without AVG,
``FSDPModule.set_force_sum_reduction_for_comms(True)`` is the supported
switch: SUM, then divide locally.) Optimizer foreach kernels across the
meshes (TP weights on ``(dp_shard, tp)``, the rest on ``dp_shard``) work in
2.13, so one parameter group suffices.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from stormwatch.trainer.model import ByteLM
from stormwatch.trainer.parallel.dims import ParallelDims

if TYPE_CHECKING:  # torch.distributed.pipelining imports torch._dynamo: only when pp > 1
    from stormwatch.trainer.parallel.pipeline import Pipeline


@dataclass(frozen=True)
class Parallelized:
    """What :func:`parallelize` returns.

    Attributes:
        model: this rank's part of the model (the whole model without PP, its
            stage with PP), an ``FSDPModule``; what the optimizer and the
            checkpoint see.
        pipeline: the stage and schedule, or ``None`` when ``pp == 1``.
    """

    model: ByteLM
    pipeline: Pipeline | None


def parallelize(
    model: ByteLM,
    dims: ParallelDims,
    *,
    device: torch.device,
    batch_shape: tuple[int, int],
    pp_schedule: str = "1F1B",
    pp_microbatches: int = 1,
    accumulation_steps: int = 1,
) -> Parallelized:
    """Shard ``model`` in place over ``dims``' mesh.

    Every rank must pass a model with identical weights (build it under the
    same seed). Afterwards parameters are DTensors: TP-sharded weights on the
    ``(dp_shard, tp)`` mesh (``(dp_replicate, dp_shard, tp)`` with HSDP), the
    rest on ``dp_shard`` (``(dp_replicate, dp_shard)``); with PP each rank
    holds only its stage's parameters, under the unsplit model's names.

    Args:
        model: the unsharded model.
        dims: degrees; :meth:`ParallelDims.build_mesh` must have been called.
        device: where activations live (pipeline buffers).
        batch_shape: ``(sequences, seq_len)`` of one data-parallel rank's
            batch per step; with PP it is cut into ``pp_microbatches``.
        pp_schedule: a key of :data:`stormwatch.trainer.parallel.pipeline.SCHEDULES`.
        pp_microbatches: micro-batches per step with PP (divides the
            sequences; ``>= pp`` for 1F1B).

    Raises:
        ValueError: PP cannot be built with these degrees (see
            :func:`stormwatch.trainer.parallel.pipeline.build_pipeline`).
    """
    # 1. Pipeline split over "pp", first, so that TP and FSDP below only touch
    #    the parameters this rank keeps.
    stage = _split_stage(model, dims) if dims.pp_enabled else 0
    # 2. Tensor parallelism over "tp" (Megatron style).
    if dims.tp_enabled:
        _apply_tensor_parallel(model, dims)
    # 3. Activation checkpointing would wrap each block here (not used).
    # 4. torch.compile would wrap each block here (not used).
    # 5. FSDP2 over "dp_shard", or HSDP over ("dp_replicate", "dp_shard"), even
    #    when dp == 1, so that checkpoints have one layout whatever the degrees.
    _apply_fsdp(model, dims, device=device)
    # 6. The pipeline stage and schedule wrap the sharded stage (the schedule
    #    drives FSDP's gradient sync across micro-batches).
    pipeline = None
    if dims.pp_enabled:
        pipeline = _build_schedule(
            model,
            dims,
            stage=stage,
            device=device,
            batch_shape=batch_shape,
            pp_schedule=pp_schedule,
            pp_microbatches=pp_microbatches,
            accumulation_steps=accumulation_steps,
        )
    return Parallelized(model=model, pipeline=pipeline)


def _split_stage(model: ByteLM, dims: ParallelDims) -> int:
    """Keep this rank's pipeline stage of ``model`` (its blocks; the embeddings on the first
    stage, norm + head on the last); returns the stage index."""
    from stormwatch.trainer.parallel.pipeline import split_stage

    stage = dims.coordinate(torch.distributed.get_rank())["pp"]
    split_stage(model, stage, dims.pp)
    return stage


def _apply_tensor_parallel(model: ByteLM, dims: ParallelDims) -> None:
    """Megatron-style TP over ``"tp"``.

    q/k/v and w1 are split by output features (columns, i.e. heads and MLP hidden
    units), wo and w2 by input features (rows), so each block needs one all-reduce
    in forward per sub-layer (after wo and after w2) and one in backward for the
    replicated input. Embeddings, norms and the head stay replicated across
    ``"tp"`` (they are small at this size). Outputs are plain (replicated)
    tensors, so what PP sends between stages is too.

    Each rank keeps its own slice of its own copy (``src_data_rank=None``) instead of
    receiving rank 0's by scatter (torch's default): every rank built the same weights
    under the same seed (:func:`stormwatch.trainer.loop.train`), so the slices are the
    same, without one collective per parameter in the start-up (README.md
    "Benchmarks", recovery).
    """
    tp_mesh = dims["tp"]
    for block in model.layers.values():
        parallelize_module(
            block,
            tp_mesh,
            {
                "attn.wq": ColwiseParallel(),
                "attn.wk": ColwiseParallel(),
                "attn.wv": ColwiseParallel(),
                "attn.wo": RowwiseParallel(),
                "mlp.w1": ColwiseParallel(),
                "mlp.w2": RowwiseParallel(),
            },
            src_data_rank=None,  # identical weights on every rank: no scatter
        )


def _apply_fsdp(model: ByteLM, dims: ParallelDims, *, device: torch.device) -> None:
    """FSDP2 (HSDP with ``dp_replicate > 1``): one unit per block, then the root.

    A block's parameters are all-gathered just before it runs; the root holds the
    rest (embeddings, final norm, head). HSDP shards inside a replica and
    all-reduces gradients across replicas.

    ``reshard_after_forward``, per block:

    - without PP: True (free the gathered parameters after forward, gather again
      in backward: memory for one all-gather), except for the last block on GPU,
      whose backward runs right after its forward; resharding it would only
      all-gather the same parameters again (torchtitan does the same). On
      CPU/gloo the last block is resharded too: its backward all-gather is where
      a rank waits for a straggler, and gloo's reduce-scatter (the only collective
      left in backward otherwise) never reports completion, so that wait would be
      counted as compute and FC-14's compute/wait split would blame the waiting ranks;
    - with PP: False for every block. A stage runs forward and backward for
      several micro-batches interleaved (1F1B), so resharding would cost an
      all-gather per micro-batch instead of one per step.

    The root is never resharded after forward by FSDP2 (its backward is next).
    Prefetching: FSDP2 issues each block's all-gather when the block is about to
    run, asynchronously, which overlaps with compute only when the CPU runs ahead
    (GPU). Explicit prefetch of the next block in forward and the previous one in
    backward issues it one block earlier, so the gather of block i+1 overlaps
    block i's compute on CPU too. The default of one unit of backward prefetch is
    kept as it is.
    """
    fsdp_mesh = dims.fsdp_mesh()
    blocks = list(model.layers.values())
    keep_last = device.type == "cuda"
    for index, block in enumerate(blocks):
        kept = dims.pp_enabled or (keep_last and index == len(blocks) - 1)
        fully_shard(block, mesh=fsdp_mesh, reshard_after_forward=not kept)
    fully_shard(model, mesh=fsdp_mesh)
    units: list[FSDPModule] = [b for b in blocks if isinstance(b, FSDPModule)]
    for current, following in itertools.pairwise(units):
        current.set_modules_to_forward_prefetch([following])


def _build_schedule(
    model: ByteLM,
    dims: ParallelDims,
    *,
    stage: int,
    device: torch.device,
    batch_shape: tuple[int, int],
    pp_schedule: str,
    pp_microbatches: int,
    accumulation_steps: int,
) -> Pipeline:
    """The pipeline stage around this rank's (sharded) stage and its schedule over ``"pp"``."""
    from stormwatch.trainer.parallel.pipeline import build_pipeline

    sequences, seq_len = batch_shape
    return build_pipeline(
        model,
        stage=stage,
        stages=dims.pp,
        group=dims["pp"].get_group(),
        device=device,
        schedule=pp_schedule,
        microbatches=pp_microbatches,
        microbatch_shape=(sequences // pp_microbatches, seq_len),
        d_model=model.config.d_model,
        accumulation_steps=accumulation_steps,
    )


__all__ = ["Parallelized", "parallelize"]
