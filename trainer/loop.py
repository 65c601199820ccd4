"""The training loop of ``stormwatch train``: one rank's whole life.

Order of operations (each rank, collectively):

1. process group, then the ``("dp", "tp")`` mesh (:class:`ParallelDims`);
2. corpus and batch sampler for this rank's data-parallel index;
3. model built under a fixed seed (identical on every rank), parallelized
   (TP, then FSDP2), AdamW;
4. the CPU RNG re-seeded per data-parallel rank (dropout); ranks of one TP
   group share the stream, so their dropout masks agree;
5. resume from the latest complete checkpoint (restores step, sampler, RNG);
6. steps: forward, backward, optimizer step, all-reduce of the loss over
   ``dp`` (the logged loss is the global mean, identical on every rank),
   with every collective counted; telemetry; checkpoint when due and after
   the last step; optional sleep (``step_delay``);
7. a final barrier, then the ``done`` record and done marker.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from stormwatch.trainer.checkpoint import Checkpointer, RankLayout, TrainState
from stormwatch.trainer.comms import CollectiveCounter
from stormwatch.trainer.config import VOCAB_SIZE, TrainConfig
from stormwatch.trainer.corpus import load_stdlib_corpus
from stormwatch.trainer.data import BatchSampler, derive_seed
from stormwatch.trainer.dims import ParallelDims
from stormwatch.trainer.faults import FaultPoint
from stormwatch.trainer.model import ByteLM
from stormwatch.trainer.parallel import parallelize
from stormwatch.trainer.runtime import RankEnv, distributed
from stormwatch.trainer.telemetry import RankTelemetry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainResult:
    """Outcome of :func:`train` on one rank.

    Attributes:
        last_step: last completed step (the resume step if nothing was left to do).
        resumed_from_step: checkpoint step resumed from, or ``None``.
        final_loss: global mean loss of the last step run by this process, or ``None``.
    """

    last_step: int
    resumed_from_step: int | None
    final_loss: float | None


def train(config: TrainConfig, env: RankEnv, *, fault: FaultPoint | None = None) -> TrainResult:
    """Run one rank of a training job; collective across the job's ranks.

    Args:
        config: the validated run configuration.
        env: this process's rank, world size and attempt.
        fault: test-only fault point (see :mod:`stormwatch.trainer.faults`).

    Raises:
        ConfigError: the degrees do not fit the world size.
        CorpusError: the corpus cannot be read.
        CheckpointError: saving or resuming failed (on every rank).
    """
    dims = ParallelDims(dp=config.dp, tp=config.tp, world_size=env.world_size)
    with contextlib.ExitStack() as stack:
        telemetry = RankTelemetry(
            config.telemetry, rank=env.rank, world_size=env.world_size, attempt=env.attempt
        )
        stack.callback(telemetry.close)
        device_type = stack.enter_context(distributed(env))
        return _run(config, env, dims, device_type, telemetry, fault)
    raise AssertionError("unreachable")  # pragma: no cover - ExitStack does not swallow


def _run(
    config: TrainConfig,
    env: RankEnv,
    dims: ParallelDims,
    device_type: str,
    telemetry: RankTelemetry,
    fault: FaultPoint | None,
) -> TrainResult:
    dims.build_mesh(device_type)
    dp_rank = dims["dp"].get_local_rank()
    device = (
        torch.device(device_type, env.local_rank) if device_type == "cuda" else torch.device("cpu")
    )
    seed = config.data.seed

    corpus = load_stdlib_corpus(config.data.corpus_max_bytes)
    sampler = BatchSampler(corpus, config=config.data, dp_rank=dp_rank)

    torch.manual_seed(derive_seed("init", seed))  # same weights on every rank
    model = parallelize(ByteLM(config.model).to(device), dims)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.optim.lr, weight_decay=config.optim.weight_decay
    )
    torch.manual_seed(derive_seed("dropout", seed, dp_rank))  # seeds CUDA too

    checkpointer = Checkpointer(
        config.checkpoint,
        state=TrainState(model=model, optimizer=optimizer, sampler=sampler, seed=seed),
        layout=RankLayout(
            rank=env.rank,
            world_size=env.world_size,
            dp=dims.dp,
            tp=dims.tp,
            dp_rank=dp_rank,
            attempt=env.attempt,
        ),
    )
    resumed = checkpointer.load_latest()
    telemetry.start(resumed_from_step=resumed)
    log.info("rank %d: training steps %d..%d", env.rank, sampler.next_step, config.steps)

    counter = CollectiveCounter(telemetry)
    dp_group = dims["dp"].get_group()
    tokens_per_step = config.data.micro_batch * config.data.seq_len
    last_step = resumed or 0
    final_loss: float | None = None
    model.train()
    while sampler.next_step <= config.steps:
        if fault is not None:
            fault.check(sampler.next_step)
        started = time.perf_counter()
        with counter:
            step, inputs, targets = sampler.next_batch()
            logits = model(inputs.to(device))
            loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), targets.to(device).reshape(-1))
            if fault is not None:
                fault.before_backward()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            global_loss = loss.detach().clone()
            dist.all_reduce(global_loss, op=dist.ReduceOp.SUM, group=dp_group)
            final_loss = float((global_loss / dims.dp).item())
        seconds = time.perf_counter() - started
        telemetry.step(step=step, loss=final_loss, seconds=seconds, tokens=tokens_per_step)
        last_step = step
        if (checkpointer.due(step) or step == config.steps) and checkpointer.save(step):
            telemetry.checkpoint(step=step)
        if config.step_delay > 0:
            time.sleep(config.step_delay)
    # Leave together: with the store on rank 0 (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
    # an early exit of rank 0 would break the others' teardown.
    dist.barrier()
    telemetry.done(step=last_step)
    return TrainResult(last_step=last_step, resumed_from_step=resumed, final_loss=final_loss)


__all__ = ["TrainResult", "train"]
