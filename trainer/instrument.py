"""Per-step measurements that need torch: gradient norm, global mean loss, memory, model FLOPs
per token.

The arithmetic (MFU, peak table) is :func:`stormwatch.telemetry.mfu` and
:func:`stormwatch.telemetry.peak_flops`;
this module reads the numbers out of the model and the process.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import psutil
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from stormwatch.telemetry import flops_per_token
from stormwatch.trainer.model import ByteLM
from stormwatch.trainer.parallel.dims import ParallelDims


def model_flops_per_token(model: ByteLM, *, seq_len: int) -> int:
    """Training FLOPs per token of the *unsharded* ``model`` (``6 N + 12 L d T``).

    ``N`` excludes the token and position embeddings (lookups, no matmul).
    Call it before :func:`~stormwatch.trainer.parallel.apply.parallelize` (or after:
    DTensor ``numel`` is the global size).
    """
    if model.tok_emb is None or model.pos_emb is None:
        raise ValueError("model_flops_per_token needs the whole model, not a pipeline stage")
    embedding = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    total = sum(p.numel() for p in model.parameters())
    config = model.config
    return flops_per_token(
        non_embedding_params=total - embedding,
        n_layers=config.n_layers,
        d_model=config.d_model,
        seq_len=seq_len,
    )


def _local_square_sum(parameters: Iterable[torch.nn.Parameter], world_size: int) -> torch.Tensor:
    total: torch.Tensor | None = None
    for parameter in parameters:
        grad = parameter.grad
        if grad is None:
            continue
        if isinstance(grad, DTensor):
            local = grad.to_local()
            shards = math.prod(
                grad.device_mesh.size(i)
                for i, placement in enumerate(grad.placements)
                if placement.is_shard()
            )
        else:
            local, shards = grad, 1
        # Every distinct shard lives on world_size / shards ranks: count it once.
        term = local.detach().double().pow(2).sum() * (shards / world_size)
        total = term if total is None else total + term
    if total is None:
        return torch.zeros((), dtype=torch.float64)
    return total


def global_grad_norm(
    parameters: Iterable[torch.nn.Parameter],
    *,
    world_size: int,
    device: torch.device,
    votes: Sequence[bool] = (),
) -> tuple[float, list[int]]:
    """L2 norm of all gradients over every rank, and a vote count; collective.

    One all-reduce on the default group. Works for a mix of DTensor meshes
    (TP-sharded on ``(dp_shard, tp)``, replicated over ``tp`` on ``dp_shard``): each
    shard's squared sum is weighted by the fraction of ranks that hold a copy.
    Reads gradients only.

    Args:
        world_size: ranks that hold (a shard of) the same parameters: the
            world size, or ``world_size // pp`` with pipeline parallelism (each
            stage's parameters live on that many ranks; the all-reduce over
            every rank then adds up all stages).
        votes: this rank's yes/no answers, each summed over ranks in the same
            all-reduce (agreement without another collective: a requested
            checkpoint, a finished async write).

    Returns:
        ``(norm, counts)``: the global norm and, per vote, the ranks that said yes.
    """
    square_sum = _local_square_sum(parameters, world_size).to(device)
    ballots = torch.tensor([1.0 if v else 0.0 for v in votes], dtype=torch.float64, device=device)
    packed = torch.cat([square_sum.reshape(1), ballots])
    dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    total, *counts = packed.tolist()
    return math.sqrt(max(total, 0.0)), [round(c) for c in counts]


def global_mean_loss(local_loss: torch.Tensor, dims: ParallelDims) -> float:
    """A loss (a step's, an evaluation's) averaged over the data-parallel ranks, the same on every rank; collective.

    Summed over ``dp_shard`` (then ``dp_replicate``) and divided by ``dp``;
    with PP only the last stage holds a loss (the others a zero), so a sum
    over ``pp`` hands it to every stage.
    """
    total = local_loss.detach().clone()
    for name in ("dp_shard", "dp_replicate", "pp"):
        if name == "dp_shard" or dict(dims.degrees)[name] > 1:
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=dims[name].get_group())
    return float((total / dims.dp).item())


def memory_bytes(device_type: str) -> dict[str, int]:
    """``{"rss": bytes}`` on CPU; ``{"cuda_max_allocated": bytes}`` (current device) on GPU."""
    if device_type == "cuda":
        return {"cuda_max_allocated": int(torch.cuda.max_memory_allocated())}
    return {"rss": int(psutil.Process().memory_info().rss)}


def device_name(device_type: str) -> str:
    """The current CUDA device's name, or ``"cpu"``."""
    if device_type == "cuda":
        return torch.cuda.get_device_name()
    return "cpu"


__all__ = [
    "device_name",
    "global_grad_norm",
    "global_mean_loss",
    "memory_bytes",
    "model_flops_per_token",
]
