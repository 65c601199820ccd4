"""Apply tensor parallelism, then FSDP2, to a :class:`~stormwatch.trainer.model.ByteLM`.

All parallelism decisions live in :func:`parallelize`, in the order
torchtitan uses: TP -> (activation checkpointing) -> (compile) -> FSDP2.
Activation checkpointing and ``torch.compile`` are not used (the model is
tiny and compile time would dominate a test run); their places are marked.

CPU / gloo (checked on torch 2.13): gloo implements what FSDP2 and DTensor
issue here: ``all_gather_into_tensor``, ``reduce_scatter_tensor`` and
``all_reduce`` with ``ReduceOp.AVG`` (FSDP2's default for fp32 gradients) and
SUM. It does not implement ``ReduceOp.PREMUL_SUM``, which FSDP2 would pick
after ``set_gradient_divide_factor(f)`` with ``f`` != the dp size; this
module never sets a divide factor. (On a backend without AVG,
``FSDPModule.set_force_sum_reduction_for_comms(True)`` is the supported
switch: SUM, then divide locally.) Optimizer foreach kernels across the two
meshes (2-D for TP weights, 1-D ``dp`` for the rest) work in 2.13, so one
parameter group suffices.
"""

from __future__ import annotations

from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from stormwatch.trainer.dims import ParallelDims
from stormwatch.trainer.model import ByteLM


def parallelize(model: ByteLM, dims: ParallelDims) -> ByteLM:
    """Shard ``model`` in place over ``dims``' mesh and return it.

    Every rank must pass a model with identical weights (build it under the
    same seed). Afterwards parameters are DTensors: TP-sharded weights on the
    ``("dp", "tp")`` mesh, the rest on the ``"dp"`` mesh.

    Args:
        model: the unsharded model.
        dims: degrees; :meth:`ParallelDims.build_mesh` must have been called.

    Returns:
        The same module object, now an ``FSDPModule``.
    """
    # 1. Tensor parallelism over "tp" (Megatron style): q/k/v and w1 are split
    #    by output features (columns, i.e. heads and MLP hidden units), wo and
    #    w2 by input features (rows), so each block needs one all-reduce in
    #    forward per sub-layer (after wo and after w2) and one in backward for
    #    the replicated input. Embeddings, norms and the head stay replicated
    #    across "tp" (they are small at this size).
    if dims.tp_enabled:
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
            )

    # 2. Activation checkpointing would wrap each block here (not used).
    # 3. torch.compile would wrap each block here (not used).

    # 4. FSDP2 over "dp": one unit per block (its parameters are all-gathered
    #    just before the block runs and freed after), then the root for the
    #    remaining parameters (embeddings, final norm, head). Applied even when
    #    dp == 1 so that every parameter is a DTensor and checkpoints have one
    #    layout whatever the degrees.
    dp_mesh = dims["dp"]
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)

    return model


__all__ = ["parallelize"]
