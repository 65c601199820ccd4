"""The training loop of ``stormwatch train``: one rank's whole life.

Order of operations (each rank, collectively):

1. process group (start-up stage ``rendezvous``), then the ``(pp, dp_replicate,
   dp_shard, tp)`` mesh (stage ``mesh``; :class:`ParallelDims`; ``pp`` and
   ``dp_replicate`` only when > 1), every group with the collective timeout;
2. corpus and batch sampler for this rank's data-parallel index;
3. model built under a fixed seed (identical on every rank), parallelized
   (stage ``parallelize``: PP split, TP, then FSDP2 / HSDP: :func:`parallelize`),
   AdamW over this rank's parameters (its pipeline stage's, with PP);
4. the CPU RNG re-seeded per data-parallel rank (dropout); ranks of one TP
   group share the stream, so their dropout masks agree;
5. the checkpointer (its own process group in async mode), a check that every
   process group of the rank has the collective timeout, and the resume from the
   latest complete checkpoint (stage ``checkpoint_load``; restores step, sampler, RNG);
6. steps (:mod:`stormwatch.trainer.steps`): forward, backward (with PP: the
   pipeline schedule, micro-batches sent between stages), the global gradient norm over every stage (one
   world all-reduce, not counted with the step's collectives), optimizer
   step, all-reduce of the loss over the data-parallel dimensions, and over
   ``pp`` from the last stage (the logged loss is the global mean, identical
   on every rank), with every collective counted and labelled by
   mesh dimension; telemetry (including the step's compute vs collective-wait
   split, MFU and memory); checkpoint when due and after the last step;
   an evaluation pass every ``--eval-every`` steps (:mod:`stormwatch.trainer.evaluation`:
   forward only over held-out batches, inside the phase ``eval``);
   optional sleep (``step_delay``); OpenTelemetry spans around the step,
   forward, backward, optimizer, evaluation and checkpoint save/load;
7. a final barrier, then the ``done`` record and done marker.

All of its telemetry goes through the public API :mod:`stormwatch.telemetry` (one
:class:`~stormwatch.telemetry.Session` per rank; nothing private of that package), as
any job's would: metrics, event log, collective counting, spans, post-mortem dumps,
and the phases that excuse a silent rank up to their bounds: the start-up stages
``rendezvous``, ``mesh``, ``parallelize`` and ``checkpoint_load`` (the heartbeat starts
before the process group, and a rank stuck in one is named by it), ``checkpoint_save``
around saves and commits with a bound from this run's own saves
(:mod:`stormwatch.trainer.checkpoint.cadence`), and ``eval`` around each evaluation pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch

# torch imports dynamo at the first DTensor or optimizer call anyway (torch._compile's
# _disable_dynamo); imported here, it loads under the CLI's GC pause (imports_without_gc).
import torch._dynamo
import torch.distributed as dist

import stormwatch.telemetry as swt
from stormwatch.faults.control_file import control_path
from stormwatch.trainer.checkpoint.budget import FailureBudget
from stormwatch.trainer.checkpoint.cadence import CheckpointCadence
from stormwatch.trainer.checkpoint.checkpointer import Checkpointer
from stormwatch.trainer.checkpoint.settings import run_settings
from stormwatch.trainer.checkpoint.state import RankLayout, TrainState
from stormwatch.trainer.config import TrainConfig
from stormwatch.trainer.control import ControlChannel
from stormwatch.trainer.data.batches import BatchSampler, derive_seed
from stormwatch.trainer.data.corpus import load_stdlib_corpus
from stormwatch.trainer.errors import Terminated
from stormwatch.trainer.evaluation import Evaluator
from stormwatch.trainer.instrument import (
    model_flops_per_token,
)
from stormwatch.trainer.model import ByteLM
from stormwatch.trainer.parallel.apply import Parallelized, parallelize
from stormwatch.trainer.parallel.dims import ParallelDims
from stormwatch.trainer.passes import ForwardBackward
from stormwatch.trainer.progress import ConsoleProgress
from stormwatch.trainer.runtime import Distributed, RankEnv, check_group_timeouts, distributed
from stormwatch.trainer.startup import StartupStages, StartupTimeline
from stormwatch.trainer.steps import StepLoop, StepReport

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
    startup: StartupTimeline | None = None,
) -> TrainResult:
    """Run one rank of a training job; collective across the job's ranks.

    Args:
        config: the validated run configuration.
        env: this process's rank, world size and attempt.
        progress: human progress lines (the CLI passes one to rank 0 only);
            it also warns when the checkpoint resumed from is already at or
            past ``config.steps`` (nothing is trained then).
        startup: this process's start-up timeline so far (the CLI marks ``cli`` and
            ``imports``); default: a new one from the process start. Logged when the
            rank is ready (:mod:`stormwatch.trainer.startup`).

    Raises:
        ConfigError: the degrees do not fit the world size.
        CorpusError: the corpus cannot be read.
        CheckpointError: saving or resuming failed (on every rank).
        InjectedFault: the ``error_at_step`` fault point of the control file fired.
        Terminated: SIGTERM arrived (torchrun stopping the worker group).
        RuntimeError: a collective failed or timed out (from torch.distributed).

    On any of these the rank first writes its post-mortem dump
    (:meth:`stormwatch.telemetry.Session.dump`).
    """
    dims = ParallelDims(
        pp=config.pp,
        dp_replicate=config.dp_replicate,
        dp_shard=config.dp,
        tp=config.tp,
        world_size=env.world_size,
    )
    with contextlib.ExitStack() as stack:
        timeline = StartupTimeline.of_this_process() if startup is None else startup
        session = _session(config)
        quiet = stack.enter_context(_sigterm_raises(session))
        # Unwound in reverse: from here a SIGTERM is ignored, not raised, while the session
        # flushes its last records (after a clean end it does nothing); then SIGTERM's
        # handler is restored. Before, the default handler came back first, so torchrun's
        # SIGTERM could kill the rank mid-flush and lose its last step records (the likely
        # cause of a step record missing in cc28's resume test).
        stack.callback(session.shutdown, clean=False)
        stack.callback(quiet)
        # Fault points of the control file (stormwatch.faults.control_file): at each start-up
        # stage, then polled at the start of every step, before anything of it runs; its
        # checkpoint_kill is the checkpointer's hook.
        control = ControlChannel(
            None
            if config.control.directory is None
            else control_path(config.control.directory, env.rank),
            attempt=env.attempt,
        )
        stages = StartupStages(session, control, timeline)
        timeline.mark("telemetry")
        timeout = config.debug.collective_timeout
        try:
            with stages.stage("rendezvous"):  # the heartbeat starts here
                group = stack.enter_context(
                    distributed(
                        env, timeout=None if timeout is None else timedelta(seconds=timeout)
                    )
                )
                env = _agree_attempt(env, session, control)
            return _run(config, env, dims, group, stages, progress)
        except BaseException as exc:
            # Before the process group is destroyed: the flight recorder still has its entries.
            session.dump(exc)  # its errno too: a port conflict is told by it
            raise
    raise AssertionError("unreachable")  # pragma: no cover - ExitStack does not swallow


def _agree_attempt(env: RankEnv, session: swt.Session, control: ControlChannel) -> RankEnv:
    """The job's attempt agreed by every rank (collective; :mod:`stormwatch.telemetry.restarts`):
    fault points and checkpoints of this attempt are keyed by it from here on."""
    agreed = session.agree_attempt()
    if agreed is None:  # warned; the node's count stands in
        return env
    if agreed.attempt != env.attempt:
        log.info(
            "rank %d: job attempt %d (this node's restart count %d; restarted by %s)",
            env.rank,
            agreed.attempt,
            env.attempt,
            ", ".join(agreed.failed_nodes) or "a peer",
        )
    control.attempt = agreed.attempt
    return dataclasses.replace(env, attempt=agreed.attempt, node_restarts=env.attempt)


def _session(config: TrainConfig) -> swt.Session:
    """This rank's telemetry session: metrics, event log, dumps, spans. Collectives are
    counted per step (:class:`~stormwatch.trainer.steps.StepLoop`), not all of them; the
    trainer turns SIGTERM into :class:`Terminated` itself (:func:`_sigterm_raises`)."""
    session = swt.init(
        job=config.telemetry.job,
        metrics_dir=config.telemetry.metrics_dir,
        log_dir=config.telemetry.log_dir,
        dump_dir=config.debug.dump_dir,
        collectives=False,
        flight_recorder=config.debug.flight_recorder_entries,
        handle_signals=False,
    )
    tracing = config.tracing
    session.trace(
        otlp_endpoint=tracing.otlp_endpoint,
        spans_dir=tracing.spans_dir,
        flush_timeout=tracing.flush_timeout,
    )
    return session


@contextlib.contextmanager
def _sigterm_raises(session: swt.Session | None = None) -> Iterator[Callable[[], None]]:
    """While training, SIGTERM raises :class:`Terminated` in the main thread.

    torchrun stops the surviving workers with SIGTERM when one fails; raising
    (instead of dying at once) lets the rank write its post-mortem dump. First the
    session hears of the stop request (:meth:`~stormwatch.telemetry.Session.stop_requested`:
    the agent counts the exit as a stop, not a failure).
    Outside the main thread (tests) nothing is installed.

    Yields:
        ``quiet()``: from then on a SIGTERM is ignored. The rank is already ending, and its
        teardown (the last records' flush) must not be cut short.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return

    raised = False

    def quiet() -> None:
        nonlocal raised
        raised = True

    def handler(signum: int, frame: object) -> None:
        nonlocal raised
        if raised:
            # A second SIGTERM (under srun both slurmstepd and torchrun send one) while the
            # first is handled: it must not cut the post-mortem dump short (its flight
            # recorder read then failed, and the dumps no longer named the hung rank).
            return
        raised = True
        if session is not None:
            session.stop_requested()
        raise Terminated(f"received signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield quiet
    finally:
        signal.signal(signal.SIGTERM, previous)


def _committed(session: swt.Session, budget: FailureBudget, step: int) -> None:
    session.checkpoint(step)
    budget.committed()


def _save_failed(session: swt.Session, step: int, error: str) -> None:
    session.checkpoint(step, error=error)


def _run(
    config: TrainConfig,
    env: RankEnv,
    dims: ParallelDims,
    group: Distributed,
    stages: StartupStages,
    progress: ConsoleProgress | None,
) -> TrainResult:
    """Steps 1-7 of the module docstring, once the process group exists."""
    session, control = stages.session, stages.control
    with stages.stage("mesh"):
        dims.build_mesh(group.device_type, group_options=group.group_options)
    session.label_groups(dims.group_names())  # collectives labelled by mesh dimension
    dp_rank = dims.dp_rank(env.rank)  # over dp_replicate x dp_shard
    device = (
        torch.device(group.device_type, env.local_rank)
        if group.device_type == "cuda"
        else torch.device("cpu")
    )
    corpus = load_stdlib_corpus(config.data.corpus_max_bytes)
    sampler = BatchSampler(corpus, config=config.data, dp=dims.dp, dp_rank=dp_rank)
    stages.timeline.mark("data")
    with stages.stage("parallelize"):
        built = _build_model(config, dims, device, sampler, dp_rank=dp_rank)
    budget = FailureBudget(
        config.checkpoint.failures_allowed, functools.partial(_save_failed, session)
    )
    with stages.stage("checkpoint_load"), session.span("checkpoint_load"):
        checkpointer = _checkpointer(  # async mode: makes its own process group
            config, env, dims, built, sampler, budget, session, control, group.timeout
        )
        # Every group exists now (the mesh's, the pipeline's, the async checkpoint's): each
        # must time out like the default group, or a lost peer blocks it for 30 minutes.
        check_group_timeouts(group.timeout)
        resumed = checkpointer.load_latest()
    stages.announce(
        config, env, dims, progress, resumed=resumed, checkpointer=checkpointer, sampler=sampler
    )
    counter = session.collective_counter()
    counter.enabled = config.telemetry.count_collectives  # False: trainer_bench.py's baseline
    steps = StepLoop(
        config,
        env,
        dims,
        device=device,
        sampler=sampler,
        model=built.parallel.model,
        optimizer=built.optimizer,
        passes=ForwardBackward(
            built.parallel.model,
            built.parallel.pipeline,
            device=device,
            accumulation=sampler.accumulation_steps,
            tracing=session,
            before_backward=control.slow_step,
        ),
        counter=counter,
        control=control,
        checkpointer=checkpointer,
        cadence=CheckpointCadence(checkpointer, budget, session),
        report=StepReport(
            config,
            dims,
            device_type=group.device_type,
            flops_per_token=built.flops_per_token,
            accumulation=sampler.accumulation_steps,
            session=session,
            progress=progress,
        ),
        session=session,
        evaluator=_evaluator(config, dims, built, sampler, device, session, progress),
    )
    last_step, final_loss = steps.run()
    _finish(config, session, progress, last_step)
    return TrainResult(last_step=last_step, resumed_from_step=resumed, final_loss=final_loss)


def _evaluator(
    config: TrainConfig,
    dims: ParallelDims,
    built: _Built,
    sampler: BatchSampler,
    device: torch.device,
    session: swt.Session,
    progress: ConsoleProgress | None,
) -> Evaluator | None:
    """The evaluation passes of ``--eval-every`` (``None`` when 0: no evaluation)."""
    if config.evaluation.every == 0:
        return None
    return Evaluator(
        config.evaluation,
        dims,
        model=built.parallel.model,
        sampler=sampler,
        device=device,
        session=session,
        progress=progress,
    )


def _finish(
    config: TrainConfig,
    session: swt.Session,
    progress: ConsoleProgress | None,
    last_step: int,
) -> None:
    """Leave together, then the ``done`` record (and marker) and the final progress line."""
    # Leave together: with the store on rank 0 (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
    # an early exit of rank 0 would break the others' teardown.
    dist.barrier()
    session.shutdown()  # the done record after the last step (or the one resumed from)
    if progress is not None:
        progress.done(
            last_step=last_step,
            checkpoint_dir=config.checkpoint.directory,
            log_dir=config.telemetry.log_dir,
            metrics_dir=config.telemetry.metrics_dir,
        )


def _checkpointer(
    config: TrainConfig,
    env: RankEnv,
    dims: ParallelDims,
    built: _Built,
    sampler: BatchSampler,
    budget: FailureBudget,
    session: swt.Session,
    control: ControlChannel,
    group_timeout: timedelta,
) -> Checkpointer:
    """The checkpointer of this rank's training state; a commit is recorded and resets ``budget``."""
    return Checkpointer(
        config.checkpoint,
        state=TrainState(
            model=built.parallel.model,
            optimizer=built.optimizer,
            sampler=sampler,
            seed=config.data.seed,
        ),
        on_commit=functools.partial(_committed, session, budget),
        fault_hook=control.checkpoint_phase,
        group_timeout=group_timeout,
        settings=run_settings(config, global_batch=sampler.global_batch),
        layout=RankLayout(
            rank=env.rank,
            world_size=env.world_size,
            dp=dims.dp,
            tp=dims.tp,
            dp_rank=dims.dp_rank(env.rank),
            attempt=env.attempt,
        ),
    )


@dataclass(frozen=True)
class _Built:
    """The model side of a run, as :func:`_build_model` sets it up.

    Attributes:
        parallel: this rank's parallelized model (its pipeline stage with PP).
        optimizer: AdamW over this rank's parameters.
        flops_per_token: of the whole, unsharded model (for MFU).
    """

    parallel: Parallelized
    optimizer: torch.optim.Optimizer
    flops_per_token: float


def _build_model(
    config: TrainConfig,
    dims: ParallelDims,
    device: torch.device,
    sampler: BatchSampler,
    *,
    dp_rank: int,
) -> _Built:
    """The model under a fixed seed (the same weights on every rank), parallelized, its AdamW."""
    seed = config.data.seed
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
    optimizer = torch.optim.AdamW(
        parallel.model.parameters(), lr=config.optim.lr, weight_decay=config.optim.weight_decay
    )
    # Dropout is re-seeded before each micro-batch (MicroBatch.dropout_seed: a function of
    # seed, step and micro-batch index, not of dp); this only covers what runs before.
    torch.manual_seed(derive_seed("dropout", seed, dp_rank))  # seeds CUDA too
    return _Built(parallel=parallel, optimizer=optimizer, flops_per_token=flops_per_token)


__all__ = ["TrainResult", "train"]
