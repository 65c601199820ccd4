"""One run's optimizer steps: fault points armed, forward and backward, gradient norm,
optimizer, global mean loss, the step's report, then checkpoint commits and saves.

Each step's order (collective on every rank): the fault points of the control
file armed for the step, forward and backward of every micro-batch
(:class:`~stormwatch.trainer.passes.ForwardBackward`; the fault points that act
before the first backward), the global gradient norm over every stage (one world
all-reduce, not counted with the step's collectives, that also carries two votes:
a requested checkpoint and a finished async save), a wait for an async save's copy
of the state if it has not ended (it must hold its own step's values), the optimizer step, the loss
all-reduced over the data-parallel dimensions and ``pp`` (the logged loss is the
global mean, identical on every rank), the step's telemetry and progress line
(:class:`StepReport`: compute vs collective-wait split, MFU, memory), then commits
and saves (:class:`~stormwatch.trainer.checkpoint.cadence.CheckpointCadence`), an
evaluation pass when one is due (:class:`~stormwatch.trainer.evaluation.Evaluator`,
outside the step: its time is not the step's), and the optional sleep (``step_delay``);
spans around the step and its parts.
"""

from __future__ import annotations

import functools
import logging
import time

import torch

import stormwatch.telemetry as swt
from stormwatch.trainer.checkpoint.cadence import CheckpointCadence
from stormwatch.trainer.checkpoint.checkpointer import Checkpointer
from stormwatch.trainer.config import TrainConfig
from stormwatch.trainer.control import Armed, ControlChannel
from stormwatch.trainer.data.batches import BatchSampler
from stormwatch.trainer.errors import ControlFileError
from stormwatch.trainer.evaluation import Evaluator
from stormwatch.trainer.instrument import (
    device_name,
    global_grad_norm,
    global_mean_loss,
    memory_bytes,
)
from stormwatch.trainer.parallel.dims import ParallelDims
from stormwatch.trainer.passes import ForwardBackward
from stormwatch.trainer.progress import ConsoleProgress
from stormwatch.trainer.runtime import RankEnv

log = logging.getLogger(__name__)


def _poll(control: ControlChannel, session: swt.Session) -> Armed:
    try:
        return control.poll()
    except ControlFileError as exc:  # a bad file arms nothing; training goes on
        session.report_error("control", exc)
        return control.armed


def _fired(session: swt.Session, step: int, point: str) -> None:
    session.fault(point, step)


class StepReport:
    """Each step's telemetry and progress line: loss, time, tokens, compute/wait split,
    MFU and memory. The device's peak FLOP/s is looked up once (unknown: a warning, no MFU).

    Args:
        config: the run's config (steps, batch shape, ``--peak-flops``).
        dims: the degrees (tokens over data-parallel ranks, devices per batch).
        device_type: ``cuda`` or ``cpu``.
        flops_per_token: of the whole model (:func:`~stormwatch.trainer.instrument.model_flops_per_token`).
        accumulation: micro-batches per rank per optimizer step.
        session: this rank's telemetry session.
        progress: rank 0's progress lines, else ``None``.
    """

    def __init__(
        self,
        config: TrainConfig,
        dims: ParallelDims,
        *,
        device_type: str,
        flops_per_token: float,
        accumulation: int,
        session: swt.Session,
        progress: ConsoleProgress | None,
    ) -> None:
        self._dims = dims
        self._device_type = device_type
        self._on_gpu = device_type == "cuda"
        self._flops_per_token = flops_per_token
        self._session = session
        self._progress = progress
        self._last_step = config.steps
        # Tokens this rank trains on per optimizer step (all its micro-batches).
        self._tokens = config.data.micro_batch * config.data.seq_len * accumulation
        self._peak = swt.peak_flops(
            device_name(device_type),
            on_gpu=device_type == "cuda",
            override=config.telemetry.peak_flops,
        )
        if self._peak is None:
            log.warning(
                "no peak FLOP/s known for %s: MFU not exported (pass --peak-flops)",
                device_name(device_type),
            )

    def __call__(
        self, *, step: int, loss: float, seconds: float, wait: float, grad_norm: float
    ) -> None:
        """Step ``step`` took ``seconds``, ``wait`` of them in collectives."""
        dims, peak = self._dims, self._peak
        self._session.record_step(
            swt.StepRecord(
                step=step,
                seconds=seconds,
                loss=loss,
                tokens=self._tokens,
                grad_norm=grad_norm,
                wait_seconds=wait,
                mfu=None
                if peak is None
                else swt.mfu(
                    flops_per_token=self._flops_per_token,
                    tokens=self._tokens,
                    seconds=seconds,
                    devices=dims.tp * dims.pp,  # the devices one data-parallel batch runs on
                    peak=peak,
                ),
                peak_flops=peak,
                # on the CPU the RSS is read by the session's flusher: no /proc read here
                memory=memory_bytes(self._device_type) if self._on_gpu else None,
                sample_rss=not self._on_gpu,
            )
        )
        if self._progress is not None:
            self._progress.step(
                step=step,
                last_step=self._last_step,
                loss=loss,
                seconds=seconds,
                tokens=self._tokens * dims.dp,
            )


class StepLoop:
    """The optimizer steps of one run, from the step after the resumed one to ``config.steps``.

    Each step: the chaos fault points armed for it, forward and backward
    (:class:`~stormwatch.trainer.passes.ForwardBackward`), the global gradient norm
    (one world all-reduce carrying the checkpoint votes), the async save's copy
    awaited, the optimizer, the
    global mean loss, the step's report, then commits and saves
    (:class:`~stormwatch.trainer.checkpoint.cadence.CheckpointCadence`);
    collectives counted by the :class:`CollectiveCounter`.

    Args:
        config: the run's config (last step, step delay).
        env, dims: this rank and the degrees.
        device: where the gradient-norm all-reduce runs.
        sampler: the batches (and the step to run next).
        model, optimizer: this rank's parallelized model and its optimizer.
        passes: forward and backward of a step.
        counter: counts and times the step's collectives (the session's).
        control: the chaos control channel (fault points, checkpoint requests).
        checkpointer, cadence: the async-write vote, and when to save and commit.
        report: the step's telemetry and progress line.
        session: fault events, control-file errors and the spans.
        evaluator: the evaluation passes (``None``: ``--eval-every 0``).
    """

    def __init__(
        self,
        config: TrainConfig,
        env: RankEnv,
        dims: ParallelDims,
        *,
        device: torch.device,
        sampler: BatchSampler,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        passes: ForwardBackward,
        counter: swt.CollectiveCounter,
        control: ControlChannel,
        checkpointer: Checkpointer,
        cadence: CheckpointCadence,
        report: StepReport,
        session: swt.Session,
        evaluator: Evaluator | None = None,
    ) -> None:
        self._config = config
        self._env = env
        self._dims = dims
        self._device = device
        self._sampler = sampler
        self._model = model
        self._optimizer = optimizer
        self._passes = passes
        self._counter = counter
        self._control = control
        self._checkpointer = checkpointer
        self._cadence = cadence
        self._report = report
        self._session = session
        self._evaluator = evaluator

    def run(self) -> tuple[int, float | None]:
        """Train to ``config.steps``; returns the last step (the one resumed from when
        nothing was left to train: 0 for a fresh start) and its global mean loss."""
        final_loss: float | None = None
        sampler = self._sampler
        last_step = sampler.next_step - 1
        self._model.train()
        try:
            while sampler.next_step <= self._config.steps:
                self._arm(sampler.next_step)
                with self._session.span("step", step=sampler.next_step):
                    last_step, final_loss = self._step()
                if self._evaluator is not None and self._evaluator.due(last_step):
                    self._evaluator.run(last_step)
                if self._config.step_delay > 0:
                    time.sleep(self._config.step_delay)
            self._cadence.commit_pending()  # async: commit the last save before "done"
        finally:
            self._checkpointer.close()  # async: the writer thread, staging buffers, cached plan
        return last_step, final_loss

    def _arm(self, step: int) -> None:
        """The control file's fault points for ``step``."""
        control = self._control
        armed = _poll(control, self._session)
        self._counter.interceptor = control.before_collective if armed.touches_collectives else None
        if armed.points:
            control.on_fire = functools.partial(_fired, self._session, step)
        control.check_step(step)

    def _step(self) -> tuple[int, float]:
        """One optimizer step; returns it and its global mean loss."""
        env, dims, counter = self._env, self._dims, self._counter
        started = time.perf_counter()
        with counter:
            step, micro_batches = self._sampler.next_micro_batches()
            local_loss = self._passes.run(micro_batches)
        norm_started = time.perf_counter()
        grad_norm, (requests, writes_done) = global_grad_norm(
            self._model.parameters(),
            # Ranks holding a copy of a stage's parameters (each stage's
            # squared sum is counted once; the all-reduce covers every stage).
            world_size=env.world_size // dims.pp,
            device=self._device,
            votes=(
                self._control.checkpoint_wanted(self._cadence.last_save_started),
                self._checkpointer.write_finished(),
            ),
        )
        norm_seconds = time.perf_counter() - norm_started  # ~all of it waits in the all-reduce
        self._cadence.before_update()  # async: the save's copy of the state must have ended
        with counter, self._session.span("optimizer"):
            self._optimizer.step()
            self._optimizer.zero_grad(set_to_none=True)
            loss = global_mean_loss(local_loss, dims)
        seconds = time.perf_counter() - started
        wait = min(counter.take_wait_seconds() + norm_seconds, seconds)
        self._report(step=step, loss=loss, seconds=seconds, wait=wait, grad_norm=grad_norm)
        # every rank's async write has finished
        self._cadence.commit_written(step, every_rank_written=writes_done == env.world_size)
        requested = requests > 0  # agreed by every rank (same all-reduce result)
        if requested and self._control.armed.checkpoint_requested_at is not None:
            self._session.fault("checkpoint_now", step)
        self._cadence.save_if_due(step, last_step=self._config.steps, requested=requested)
        return step, loss


__all__ = ["StepLoop", "StepReport"]
