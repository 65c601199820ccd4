"""PyTorch Lightning: :class:`StormwatchCallback` reports a Lightning job through
:mod:`stormwatch.telemetry`, so the node agent, the alerts and the post-mortems see it as
they see the reference trainer::

    from stormwatch.telemetry.integrations.lightning import StormwatchCallback

    trainer = pl.Trainer(..., callbacks=[StormwatchCallback()])

What each Lightning hook reports (the public API only: ``init``, ``step``, ``phase``,
``checkpoint``, ``shutdown``, and the session's ``start``, ``dump`` and
``collective_counter``):

* construction, in a process torchrun or srun started as one rank (``RANK`` and
  ``WORLD_SIZE``, or ``SLURM_PROCID`` and ``SLURM_NTASKS``): ``init()``, before Lightning
  creates the process group, so that PyTorch's flight recorder (read into the
  post-mortem dumps) and collective counting are on from the first collective. Under
  Lightning's own launchers the ranks are known only later: ``init()`` at ``setup``
  (the flight recorder is then off; the API warns once).
* ``on_load_checkpoint`` to ``on_train_start``: the ``checkpoint_load`` phase (restoring
  the model, optimizer and loop state read from the file; Lightning calls callbacks only
  once the file is read).
* ``on_train_start``: the start record and heartbeat, with the step resumed from
  (``trainer.global_step`` after a restore, else none).
* ``on_train_batch_end``, when an optimizer step ended (``trainer.global_step``
  advanced; with gradient accumulation not after every batch): ``step(global_step)``
  with the loss (the sum of the batches' losses since the last step, as Lightning
  returns them, each divided by the accumulation count: the mean; this rank's own
  loss, read with ``float()``, one device sync per step), the samples (the batches'
  sizes, ``samples(batch)`` or Lightning's ``extract_batch_size``), tokens when
  ``tokens(batch)`` says how many a batch holds, the first optimizer's first learning
  rate, and the gradient norm.
* ``on_before_optimizer_step``: the L2 norm of the gradients (``grad_norm=True``, the
  default; of the module's parameters as listed at ``on_train_start``), for strategies whose ranks hold the whole gradient (DDP, one device); it is
  left out under sharded ones (FSDP, DeepSpeed), where a rank holds a shard.
* ``on_validation_start``/``end``: the ``eval`` phase (sanity check included).
* ``on_save_checkpoint`` (every rank; rank 0 then writes the file and all meet in a
  barrier): the ``checkpoint_save`` phase, which ends, and the checkpoint is recorded as
  committed, at the next ``on_train_batch_start``, ``on_train_end`` or ``teardown``:
  the save has returned by then.
* ``on_exception``: the phases end; a checkpoint still being saved is recorded as
  failed with the exception; the rank writes its post-mortem dump (flight recorder and
  last collectives: a collective timeout, a peer gone); the session ends unclean (no done
  marker: the rank did not finish). Ending it here matters for a ``KeyboardInterrupt``
  (SIGINT): Lightning then leaves through ``sys.exit(1)`` with no exception, which the
  API's exit hooks would take for a clean end.
* SIGTERM: the dump is written first thing (the session's
  :class:`~stormwatch.telemetry.lifecycle.sigterm.SigtermDump`: put in front of
  Lightning's handler at ``on_sanity_check_start``/``on_train_start``, and its thread for
  a rank waiting in a collective), because Lightning's own SIGTERM handler
  broadcasts to the other ranks before the API's runs: in a hung job that broadcast
  blocks, and shows in the flight recorder as one more collective of the hung rank.
* ``teardown`` after a fit that ended normally: ``shutdown()`` (done record and marker).

Only ``fit`` is reported (``validate``/``test``/``predict`` runs are not training). A
``tokens``/``samples`` function that raises is one warning, and that count is left out
from then on; any other failure inside the callback is one warning per hook on the
``stormwatch.telemetry`` logger; neither reaches training. Overhead, measured on a small
DDP job: docs/instrument-your-job.md, "PyTorch Lightning".
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
from pytorch_lightning.utilities.data import extract_batch_size

import stormwatch.telemetry as swt

logger = logging.getLogger("stormwatch.telemetry")
_F = TypeVar("_F", bound=Callable[..., None])

#: Variables a launcher sets in each rank's process: torchrun's, srun's.
PER_RANK_ENV = (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"))


def launched_per_rank(environ: Mapping[str, str]) -> bool:
    """Whether torchrun or srun started this process as one rank of the job."""
    return any(all(name in environ for name in names) for names in PER_RANK_ENV)


def _guarded(hook: _F) -> _F:
    """A hook that never raises into training: one warning per hook, then quiet."""
    warned: set[str] = set()

    @functools.wraps(hook)
    def run(self: StormwatchCallback, *args: Any, **kwargs: Any) -> None:
        try:
            hook(self, *args, **kwargs)
        except Exception as exc:
            if hook.__name__ not in warned:
                warned.add(hook.__name__)
                logger.warning(
                    "stormwatch Lightning callback: %s failed (%s: %s); training continues, "
                    "this hook's telemetry may be incomplete",
                    hook.__name__,
                    type(exc).__name__,
                    exc,
                )

    return run  # type: ignore[return-value]


class StormwatchCallback(pl.Callback):
    """Reports a Lightning fit through :mod:`stormwatch.telemetry` (module docstring).

    Args:
        job / metrics_dir / log_dir / dump_dir: passed to :func:`stormwatch.telemetry.init`
            (defaults: ``STORMWATCH_JOB`` ... from the environment, as it documents).
        tokens: called with each training batch, returns how many tokens it holds (e.g.
            ``lambda batch: batch["input_ids"].numel()``); ``None``: no token count.
        samples: called with each training batch, returns how many samples it holds;
            ``None``: Lightning's ``extract_batch_size`` (the first tensor's length).
        grad_norm: report the gradients' L2 norm (one pass over them per step, and a
            device sync); only under DDP or a single device.
    """

    def __init__(
        self,
        *,
        job: str | None = None,
        metrics_dir: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        dump_dir: str | os.PathLike[str] | None = None,
        tokens: Callable[[Any], int] | None = None,
        samples: Callable[[Any], int] | None = None,
        grad_norm: bool = True,
    ) -> None:
        super().__init__()
        self._init_args: dict[str, Any] = {
            "job": job,
            "metrics_dir": metrics_dir,
            "log_dir": log_dir,
            "dump_dir": dump_dir,
        }
        self._count_tokens = tokens
        self._count_samples = samples
        self._want_grad_norm = grad_norm
        self._phases: dict[str, contextlib.ExitStack] = {}
        self._saving: int | None = None  # the step of a checkpoint being saved
        self._marked = -1  # the last step marked
        self._failed: set[str] = set()  # counts whose function failed (left out since)
        # the module's parameters, listed once per fit (the norm reads their .grad each step)
        self._parameters: list[torch.nn.Parameter] | None = None
        self._reset_step()
        if launched_per_rank(os.environ):
            self._init()

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (``ddp_spawn`` sends the trainer to its processes): without the open
        phases, which belong to this process."""
        state = dict(self.__dict__)
        state["_phases"] = {}
        state["_parameters"] = None
        return state

    def _init(self) -> None:
        swt.init(**self._init_args)  # the first call makes the session, later ones return it

    @staticmethod
    def _dump_first_on_sigterm() -> None:
        session = swt.session()
        if session is not None:
            session.dump_first_on_sigterm()  # Lightning has installed its handler by now

    def _reset_step(self) -> None:
        self._loss: torch.Tensor | None = None
        self._samples: int | None = 0
        self._tokens: int | None = 0
        self._grad_norm: float | None = None

    def _count(self, what: str, count: Callable[[Any], int] | None, batch: Any) -> int | None:
        """``count(batch)`` (samples without one: Lightning's ``extract_batch_size``);
        ``None`` once it failed (one warning; that count is then left out)."""
        if what in self._failed:
            return None
        try:
            value = count(batch) if count is not None else extract_batch_size(batch)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TypeError(f"returned {value!r}, not a count (an int >= 0)")
            return value
        except Exception as exc:
            self._failed.add(what)
            logger.warning(
                "stormwatch Lightning callback: %s(batch) failed (%s: %s); %s are left out of "
                "the step marks from now on (fix the %s= function given to StormwatchCallback)",
                what, type(exc).__name__, exc, what, what,
            )  # fmt: skip
            return None

    # ------------------------------------------------------------------ phases
    def _enter(self, name: str) -> None:
        if name not in self._phases:
            stack = contextlib.ExitStack()
            stack.enter_context(swt.phase(name))
            self._phases[name] = stack

    def _leave(self, name: str) -> None:
        stack = self._phases.pop(name, None)
        if stack is not None:
            stack.close()

    def _commit_save(self) -> None:
        """The save begun in :meth:`on_save_checkpoint` has returned: committed."""
        if self._saving is not None:
            step, self._saving = self._saving, None
            self._leave("checkpoint_save")
            swt.checkpoint(step)

    # ------------------------------------------------------------------ lifecycle
    @_guarded
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._init()

    @_guarded
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn == "fit":
            self._enter("checkpoint_load")

    @_guarded
    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._dump_first_on_sigterm()

    @_guarded
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._dump_first_on_sigterm()
        self._leave("checkpoint_load")
        session = swt.session()
        if session is not None:
            session.start(resumed_from_step=trainer.global_step or None)
        self._marked = trainer.global_step
        self._parameters = (
            list(pl_module.parameters())
            if self._want_grad_norm and _whole_gradients(trainer.strategy)
            else None
        )
        self._reset_step()

    @_guarded
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._commit_save()

    @_guarded
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if self._saving is not None:
            step, self._saving = self._saving, None
            swt.checkpoint(step, error=exception)
        for name in list(self._phases):
            self._leave(name)
        session = swt.session()
        if session is not None and not session.dumped_on_sigterm:  # keep the signal's moment
            _dump(f"{type(exception).__name__}: {exception}"[:500])
        if session is not None:
            session.shutdown(clean=False)  # not the exit hooks: sys.exit(1) looks clean there

    @_guarded
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._commit_save()
        for name in list(self._phases):
            self._leave(name)
        swt.shutdown()  # Lightning calls teardown hooks only after a fit that did not raise

    # ------------------------------------------------------------------ steps
    @_guarded
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._commit_save()

    @_guarded
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        parameters = self._parameters  # listed at on_train_start, under DDP or one device
        if parameters is None:
            return
        grads = [p.grad for p in parameters if p.grad is not None]
        if grads:
            self._grad_norm = float(torch.nn.utils.get_total_norm(grads))

    @_guarded
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            loss = loss.detach()
            self._loss = loss if self._loss is None else self._loss + loss
        self._samples = _add(self._samples, self._count("samples", self._count_samples, batch))
        if self._count_tokens is not None:
            self._tokens = _add(self._tokens, self._count("tokens", self._count_tokens, batch))
        step = trainer.global_step
        if step <= self._marked:
            return  # accumulating gradients: no optimizer step yet
        self._marked = step
        swt.step(
            step,
            loss=None if self._loss is None else float(self._loss),
            samples=self._samples,
            tokens=self._tokens if self._count_tokens is not None else None,
            lr=_learning_rate(trainer),
            grad_norm=self._grad_norm,
        )
        self._reset_step()

    # ------------------------------------------------------------------ pauses
    @_guarded
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._enter("eval")

    @_guarded
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._leave("eval")

    @_guarded
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn != "fit":
            return
        self._commit_save()  # a second save before training went on: the first returned
        self._saving = trainer.global_step
        self._enter("checkpoint_save")


def _add(total: int | None, count: int | None) -> int | None:
    """A step's count so far plus one batch's; unknown once one batch's is unknown."""
    return None if total is None or count is None else total + count


def _dump(reason: str) -> None:
    """The session's post-mortem dump (:meth:`~stormwatch.telemetry.Session.dump`), if a
    session is open."""
    session = swt.session()
    if session is not None and not session.closed:
        session.dump(reason)


def _whole_gradients(strategy: Any) -> bool:
    """Whether each rank holds the whole gradient (DDP, one device; not FSDP, DeepSpeed)."""
    if isinstance(strategy, DeepSpeedStrategy):
        return False
    return isinstance(strategy, (DDPStrategy, SingleDeviceStrategy))


def _learning_rate(trainer: pl.Trainer) -> float | None:
    """The first parameter group's learning rate of the first optimizer, if any."""
    if not trainer.optimizers:
        return None
    groups = trainer.optimizers[0].param_groups
    return float(groups[0]["lr"]) if groups else None


__all__ = ["PER_RANK_ENV", "StormwatchCallback", "launched_per_rank"]
