"""The training loop of ``stormwatch train``: one rank's whole life.

Order of operations (each rank, collectively):

1. process group, then the ``(pp, dp_replicate, dp_shard, tp)`` mesh
   (:class:`ParallelDims`; ``pp`` and ``dp_replicate`` only when > 1);
2. corpus and batch sampler for this rank's data-parallel index;
3. model built under a fixed seed (identical on every rank), parallelized
   (PP split, TP, then FSDP2 / HSDP: :func:`parallelize`), AdamW over this
   rank's parameters (its pipeline stage's, with PP);
4. the CPU RNG re-seeded per data-parallel rank (dropout); ranks of one TP
   group share the stream, so their dropout masks agree;
5. resume from the latest complete checkpoint (restores step, sampler, RNG);
6. steps: forward, backward (with PP: the pipeline schedule, micro-batches
   sent between stages), the global gradient norm over every stage (one
   world all-reduce, not counted with the step's collectives), optimizer
   step, all-reduce of the loss over the data-parallel dimensions, and over
   ``pp`` from the last stage (the logged loss is the global mean, identical
   on every rank), with every collective counted and labelled by
   mesh dimension; telemetry (including the step's compute vs collective-wait
   split, MFU and memory); checkpoint when due and after the last step;
   optional sleep (``step_delay``); OpenTelemetry spans around the step,
   forward, backward, optimizer and checkpoint save/load
   (:mod:`stormwatch.trainer.telemetry.tracing`);
7. a final barrier, then the ``done`` record and done marker.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule

from stormwatch.faults.control_file import control_path
from stormwatch.trainer.checkpoint.budget import FailureBudget
from stormwatch.trainer.checkpoint.checkpointer import Checkpointer, RankLayout, TrainState
from stormwatch.trainer.config import VOCAB_SIZE, TrainConfig
from stormwatch.trainer.control import Armed, ControlChannel, ControlFileError
from stormwatch.trainer.data.batches import BatchSampler, derive_seed
from stormwatch.trainer.data.corpus import load_stdlib_corpus
from stormwatch.trainer.errors import Terminated
from stormwatch.trainer.model import ByteLM
from stormwatch.trainer.parallel.apply import parallelize
from stormwatch.trainer.parallel.dims import ParallelDims
from stormwatch.trainer.progress import ConsoleProgress
from stormwatch.trainer.runtime import RankEnv, distributed
from stormwatch.trainer.telemetry.comms import CollectiveCounter
from stormwatch.trainer.telemetry.dump import RankDumper
from stormwatch.trainer.telemetry.instrument import (
    device_name,
    global_grad_norm,
    memory_bytes,
    model_flops_per_token,
)
from stormwatch.trainer.telemetry.perf import mfu, peak_flops
from stormwatch.trainer.telemetry.rank import RankTelemetry
from stormwatch.trainer.telemetry.tracing import RankTracing

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


def train(
    config: TrainConfig,
    env: RankEnv,
    *,
    progress: ConsoleProgress | None = None,
) -> TrainResult:
    """Run one rank of a training job; collective across the job's ranks.

    Args:
        config: the validated run configuration.
        env: this process's rank, world size and attempt.
        progress: human progress lines (the CLI passes one to rank 0 only);
            it also warns when the checkpoint resumed from is already at or
            past ``config.steps`` (nothing is trained then).

    Raises:
        ConfigError: the degrees do not fit the world size.
        CorpusError: the corpus cannot be read.
        CheckpointError: saving or resuming failed (on every rank).
        InjectedFault: the ``error_at_step`` fault point of the control file fired.
        Terminated: SIGTERM arrived (torchrun stopping the worker group).
        RuntimeError: a collective failed or timed out (from torch.distributed).

    On any of these the rank first writes its post-mortem dump
    (:mod:`stormwatch.trainer.telemetry.dump`).
    """
    dims = ParallelDims(
        pp=config.pp,
        dp_replicate=config.dp_replicate,
        dp_shard=config.dp,
        tp=config.tp,
        world_size=env.world_size,
    )
    with contextlib.ExitStack() as stack:
        telemetry = RankTelemetry(
            config.telemetry, rank=env.rank, world_size=env.world_size, attempt=env.attempt
        )
        stack.callback(telemetry.close)
        tracing = RankTracing(
            config.tracing,
            rank=env.rank,
            attributes={"job": config.telemetry.job, "attempt": env.attempt},
        )
        stack.callback(_close_tracing, tracing, telemetry)
        dumper = RankDumper(config.debug.dump_dir, rank=env.rank, attempt=env.attempt)
        stack.enter_context(_sigterm_raises())
        timeout = config.debug.collective_timeout
        device_type = stack.enter_context(
            distributed(env, timeout=None if timeout is None else timedelta(seconds=timeout))
        )
        try:
            return _run(config, env, dims, device_type, telemetry, dumper, tracing, progress)
        except BaseException as exc:
            # Before the process group is destroyed: the flight recorder still has its entries.
            dumper.dump(f"{type(exc).__name__}: {exc}")
            raise
    raise AssertionError("unreachable")  # pragma: no cover - ExitStack does not swallow


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While training, SIGTERM raises :class:`Terminated` in the main thread.

    torchrun stops the surviving workers with SIGTERM when one fails; raising
    (instead of dying at once) lets the rank write its post-mortem dump.
    Outside the main thread (tests) nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated(f"received signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _set_gradient_sync(model: torch.nn.Module, sync: bool) -> None:
    """FSDP2: reduce-scatter gradients in this backward (``sync``) or keep accumulating
    them unsharded (``FSDPModule.set_requires_gradient_sync``); no-op for other modules."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)


def _global_mean_loss(local_loss: torch.Tensor, dims: ParallelDims) -> float:
    """The step's loss averaged over the data-parallel ranks, the same on every rank; collective.

    Summed over ``dp_shard`` (then ``dp_replicate``) and divided by ``dp``;
    with PP only the last stage holds a loss (the others a zero), so a sum
    over ``pp`` hands it to every stage.
    """
    total = local_loss.detach().clone()
    for name in ("dp_shard", "dp_replicate", "pp"):
        if name == "dp_shard" or dict(dims.degrees)[name] > 1:
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=dims[name].get_group())
    return float((total / dims.dp).item())


def _close_tracing(tracing: RankTracing, telemetry: RankTelemetry) -> None:
    dropped = tracing.close()
    if dropped:
        telemetry.on_error("tracing", RuntimeError(f"{dropped} spans not exported at exit"))


def _committed(telemetry: RankTelemetry, budget: FailureBudget, step: int) -> None:
    telemetry.checkpoint(step=step)
    budget.committed()


def _save_failed(telemetry: RankTelemetry, step: int, error: str) -> None:
    telemetry.checkpoint_failed(step=step, error=error)


def _poll(control: ControlChannel, telemetry: RankTelemetry) -> Armed:
    try:
        return control.poll()
    except ControlFileError as exc:  # a bad file arms nothing; training goes on
        telemetry.on_error("control", exc)
        return control.armed


def _fired(telemetry: RankTelemetry, step: int, point: str) -> None:
    telemetry.fault(point=point, step=step)


def _run(
    config: TrainConfig,
    env: RankEnv,
    dims: ParallelDims,
    device_type: str,
    telemetry: RankTelemetry,
    dumper: RankDumper,
    tracing: RankTracing,
    progress: ConsoleProgress | None,
) -> TrainResult:
    dims.build_mesh(device_type)
    dp_rank = dims.dp_rank(env.rank)  # over dp_replicate x dp_shard
    device = (
        torch.device(device_type, env.local_rank) if device_type == "cuda" else torch.device("cpu")
    )
    seed = config.data.seed

    corpus = load_stdlib_corpus(config.data.corpus_max_bytes)
    sampler = BatchSampler(corpus, config=config.data, dp=dims.dp, dp_rank=dp_rank)

    torch.manual_seed(derive_seed("init", seed))  # same weights on every rank
    unsharded = ByteLM(config.model).to(device)
    flops_per_token = model_flops_per_token(unsharded, seq_len=config.data.seq_len)
    parallel = parallelize(
        unsharded,
        dims,
        device=device,
        batch_shape=(config.data.micro_batch, config.data.seq_len),
        pp_schedule=config.pp_schedule,
        pp_microbatches=config.microbatches,
        accumulation_steps=sampler.accumulation_steps,
    )
    model = parallel.model
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.optim.lr, weight_decay=config.optim.weight_decay
    )
    # Dropout is re-seeded before each micro-batch (MicroBatch.dropout_seed: a function of
    # seed, step and micro-batch index, not of dp); this only covers what runs before.
    torch.manual_seed(derive_seed("dropout", seed, dp_rank))  # seeds CUDA too

    # Fault points of the control file (stormwatch.faults.control_file): polled at the start
    # of every step, before anything of it runs; its checkpoint_kill is the checkpointer's hook.
    control = ControlChannel(
        None
        if config.control.directory is None
        else control_path(config.control.directory, env.rank),
        attempt=env.attempt,
    )
    budget = FailureBudget(
        config.checkpoint.failures_allowed, functools.partial(_save_failed, telemetry)
    )
    checkpointer = Checkpointer(
        config.checkpoint,
        state=TrainState(model=model, optimizer=optimizer, sampler=sampler, seed=seed),
        on_commit=functools.partial(_committed, telemetry, budget),
        fault_hook=control.checkpoint_phase,
        layout=RankLayout(
            rank=env.rank,
            world_size=env.world_size,
            dp=dims.dp,
            tp=dims.tp,
            dp_rank=dp_rank,
            attempt=env.attempt,
        ),
    )
    with tracing.span("checkpoint_load"):
        resumed = checkpointer.load_latest()
    telemetry.start(resumed_from_step=resumed)
    telemetry.checkpoint_interval(config.checkpoint.every if checkpointer.enabled else 0)
    log.info("rank %d: training steps %d..%d", env.rank, sampler.next_step, config.steps)
    if progress is not None:
        progress.start(
            world_size=env.world_size,
            mesh=dims.mesh_degrees,
            resumed_from_step=resumed,
            steps=config.steps,
            checkpoint_dir=config.checkpoint.directory,
        )
    if resumed is not None and resumed >= config.steps:
        log.info(
            "rank %d: checkpoint step %d >= steps %d, nothing to train",
            env.rank,
            resumed,
            config.steps,
        )
        if progress is not None:
            progress.nothing_to_do(
                checkpoint_step=resumed,
                steps=config.steps,
                checkpoint_dir=config.checkpoint.directory,
            )

    counter = CollectiveCounter(
        telemetry,
        groups=dims.group_names(),
        observer=telemetry,
        enabled=config.telemetry.count_collectives,  # False: benchmarks/trainer_bench.py's baseline
    )
    dumper.recent = counter.recent
    pipeline = parallel.pipeline
    accumulation = sampler.accumulation_steps  # micro-batches per rank per optimizer step
    tokens_per_step = config.data.micro_batch * config.data.seq_len * accumulation
    peak = peak_flops(
        device_name(device_type),
        on_gpu=device_type == "cuda",
        override=config.telemetry.peak_flops,
    )
    if peak is None:
        log.warning(
            "no peak FLOP/s known for %s: MFU not exported (pass --peak-flops)",
            device_name(device_type),
        )
    last_save_started: float | None = None
    last_step = resumed or 0
    final_loss: float | None = None
    model.train()
    while sampler.next_step <= config.steps:
        dumper.step = sampler.next_step
        armed = _poll(control, telemetry)
        counter.interceptor = control.before_collective if armed.touches_collectives else None
        if armed.points:
            control.on_fire = functools.partial(_fired, telemetry, sampler.next_step)
        control.check_step(sampler.next_step)
        with tracing.span("step", step=sampler.next_step):
            started = time.perf_counter()
            with counter:
                # Gradient accumulation (constant global batch, trainer/data/batches.py): FSDP2
                # reduce-scatters only after the last micro-batch; each loss is scaled by
                # 1/A so the gradient is that of the mean over the global batch.
                step, micro_batches = sampler.next_micro_batches()
                local_loss: torch.Tensor | None = None
                for j, micro in enumerate(micro_batches):
                    if accumulation > 1 and pipeline is None:  # PP: the schedule syncs
                        _set_gradient_sync(model, j == accumulation - 1)
                    torch.manual_seed(micro.dropout_seed)
                    if pipeline is not None:  # PP: the schedule runs forward and backward
                        if j == 0:
                            control.slow_step()
                        with tracing.span("pipeline", micro_batch=micro.index):
                            detached = pipeline.forward_backward(
                                micro.inputs.to(device), micro.targets.to(device)
                            )
                        local_loss = detached if local_loss is None else local_loss + detached
                        continue
                    with tracing.span("forward", micro_batch=micro.index):
                        logits = model(micro.inputs.to(device))
                        loss = F.cross_entropy(
                            logits.reshape(-1, VOCAB_SIZE), micro.targets.to(device).reshape(-1)
                        )
                        if accumulation > 1:  # A == 1: exactly the unscaled loss (bitwise)
                            loss = loss / accumulation
                    with tracing.span("backward", micro_batch=micro.index):
                        if j == 0:
                            control.slow_step()
                        loss.backward()
                    detached = loss.detach()
                    local_loss = detached.clone() if local_loss is None else local_loss + detached
                assert local_loss is not None
            norm_started = time.perf_counter()
            grad_norm, (requests, writes_done) = global_grad_norm(
                model.parameters(),
                # Ranks holding a copy of a stage's parameters (each stage's
                # squared sum is counted once; the all-reduce covers every stage).
                world_size=env.world_size // dims.pp,
                device=device,
                votes=(control.checkpoint_wanted(last_save_started), checkpointer.write_finished()),
            )
            norm_seconds = time.perf_counter() - norm_started  # ~all of it waits in the all-reduce
            with counter, tracing.span("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                final_loss = _global_mean_loss(local_loss, dims)
            seconds = time.perf_counter() - started
            wait = min(counter.take_wait_seconds() + norm_seconds, seconds)
            telemetry.step(step=step, loss=final_loss, seconds=seconds, tokens=tokens_per_step)
            if progress is not None:
                progress.step(
                    step=step,
                    last_step=config.steps,
                    loss=final_loss,
                    seconds=seconds,
                    tokens=tokens_per_step * dims.dp,
                )
            telemetry.step_details(
                compute_seconds=seconds - wait,
                wait_seconds=wait,
                grad_norm=grad_norm,
                mfu=None
                if peak is None
                else mfu(
                    flops_per_token=flops_per_token,
                    tokens=tokens_per_step,
                    seconds=seconds,
                    devices=dims.tp * dims.pp,  # the devices one data-parallel batch runs on
                    peak=peak,
                ),
                peak_flops=peak,
                memory=memory_bytes(device_type),
            )
            last_step = step
            if writes_done == env.world_size:  # every rank's async write has finished
                pending = checkpointer.pending_step
                with tracing.span("checkpoint_commit", step=pending):
                    budget.run(pending or step, checkpointer.finish)
            requested = requests > 0  # agreed by every rank (same all-reduce result)
            if requested and control.armed.checkpoint_requested_at is not None:
                telemetry.fault(point="checkpoint_now", step=step)
            if checkpointer.due(step) or step == config.steps or requested:
                last_save_started = time.time()
                pending = checkpointer.pending_step
                if pending is not None:  # async: commit (or count the failure of) the last one
                    with tracing.span("checkpoint_commit", step=pending):
                        budget.run(pending, checkpointer.finish)
                with tracing.span("checkpoint_save", step=step):
                    budget.run(step, functools.partial(checkpointer.save, step))
        if config.step_delay > 0:
            time.sleep(config.step_delay)
    if checkpointer.pending_step is not None:  # async: commit the last save before "done"
        pending = checkpointer.pending_step
        with tracing.span("checkpoint_commit", step=pending):
            budget.run(pending, checkpointer.finish)
    # Leave together: with the store on rank 0 (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
    # an early exit of rank 0 would break the others' teardown.
    dist.barrier()
    telemetry.done(step=last_step)
    if progress is not None:
        progress.done(
            last_step=last_step,
            checkpoint_dir=config.checkpoint.directory,
            log_dir=config.telemetry.log_dir,
            metrics_dir=config.telemetry.metrics_dir,
        )
    return TrainResult(last_step=last_step, resumed_from_step=resumed, final_loss=final_loss)


__all__ = ["TrainResult", "train"]
