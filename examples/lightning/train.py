#!/usr/bin/env python3
"""A small PyTorch Lightning DDP job that stormwatch observes through one callback.

    torchrun --nproc-per-node 2 examples/lightning/train.py --max-steps 50 --checkpoint-every 10

The integration is two lines (``StormwatchCallback`` in ``Trainer(callbacks=...)``, see
:func:`build_trainer`); everything else is an ordinary Lightning job:

* DDP on the CPU with gloo (``accelerator="cpu"``, ``DDPStrategy(process_group_backend=
  "gloo")``), one process per rank started by torchrun. torchrun's environment is named
  explicitly (``TorchElasticEnvironment``): inside a Slurm allocation Lightning would
  otherwise read the world size from ``SLURM_NTASKS`` (one torchrun per node there).
* A checkpoint every ``--checkpoint-every`` optimizer steps in ``--checkpoint-dir``
  (default ``$STORMWATCH_CHECKPOINT_DIR``, which the stormwatch lab and Slurm recipe set,
  else ``./checkpoints``): ``ModelCheckpoint(every_n_train_steps=N, save_last="link")``.
  Every start resumes from the last one (``fit(ckpt_path="last")``; nothing to resume from
  on the first start), so a worker group torchrun restarts after a lost rank, or a job
  Slurm requeues, continues from its last checkpoint.
* Deterministic: the same ``--seed`` gives the same losses bit for bit, also across a
  restart. Rank r's batch for optimizer step s is drawn from its own generator seeded with
  (seed, s, r), and the batches are a resumable iterable (:class:`SyntheticBatches`:
  ``state_dict``/``load_state_dict``, which Lightning saves in the checkpoint), so a
  resumed run sees exactly the batches an uninterrupted one does. The model is a small
  MLP regressing a fixed random "teacher" network's output.

Options: ``--max-steps``, ``--checkpoint-every`` (0: never), ``--checkpoint-dir``,
``--seed``, ``--batch-size`` (per rank), ``--width`` (hidden units), ``--lr``,
``--step-delay`` (seconds of sleep in every training step: a slower job, so that an
experiment can act at a given step), ``--val-every`` (a validation pass every N steps,
0: none), ``--no-stormwatch`` (the same job without the callback: the benchmark's
baseline, benchmarks/lightning_bench.py), ``--step-times FILE`` (rank 0 writes the
wall and CPU time of every step there, for the benchmark), and ``--stall-rank R
--stall-at-step S``: rank R's batches stop coming before step S, in the first attempt only
(no torchrun restart, no Slurm requeue yet), as when a data loader deadlocks; the rank
then waits, alive and in no collective, while the others wait for it in their gradient
all-reduce: a hung rank (tests/telemetry/integrations/test_lightning_lab.py). What
stormwatch reports for it: docs/instrument-your-job.md, "PyTorch Lightning".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.plugins.environments import TorchElasticEnvironment
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.nn import functional as F

#: Input features of the synthetic regression task.
FEATURES = 32


def _generator(*seeds: int) -> torch.Generator:
    """A CPU generator seeded from ``seeds`` (a fixed mix: the same on every run)."""
    mixed = 0
    for seed in seeds:
        mixed = (mixed * 1_000_003 + seed) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


class SyntheticBatches:
    """Rank ``rank``'s batches, one per optimizer step, resumable.

    Batch of step s (1-based): ``x`` ``[batch_size, FEATURES]`` standard normal from the
    generator of (seed, s, rank), ``y`` ``[batch_size, 1]`` = ``teacher(x)`` + 0.01 noise.
    ``__len__`` is the whole run, so the run is one epoch and Lightning does not prefetch
    past the current batch: :meth:`state_dict` at a checkpoint names the next step exactly.
    """

    def __init__(
        self, *, steps: int, batch_size: int, seed: int, rank: int, stall_at: int | None = None
    ) -> None:
        self.steps, self.batch_size, self.seed, self.rank = steps, batch_size, seed, rank
        teacher = _generator(seed, 0, 1_000_000)
        self.weight = torch.randn(FEATURES, 1, generator=teacher) / FEATURES**0.5
        self.next_step = 1
        self.stall_at = stall_at

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while self.next_step <= self.steps:
            if self.next_step == self.stall_at:
                _stall()
            gen = _generator(self.seed, self.next_step, self.rank)
            self.next_step += 1
            x = torch.randn(self.batch_size, FEATURES, generator=gen)
            noise = 0.01 * torch.randn(self.batch_size, 1, generator=gen)
            yield x, torch.tanh(x @ self.weight) + noise

    def state_dict(self) -> dict[str, int]:
        return {"next_step": self.next_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_step = int(state["next_step"])


def first_attempt() -> bool:
    """No restart yet: neither torchrun (``TORCHELASTIC_RESTART_COUNT``) nor Slurm
    (``SLURM_RESTART_COUNT``, a requeue) has started this job's processes again."""
    restarts = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
    return all(os.environ.get(name, "0") == "0" for name in restarts)


def _stall() -> None:
    """A data loader that stops producing batches (a dead storage mount, a deadlocked
    worker): the rank waits here, alive, in no collective, until it is signalled."""
    print(f"lightning: rank {os.environ.get('RANK', '0')} stalls (--stall-rank)", file=sys.stderr)
    while True:
        time.sleep(1.0)


class FixedBatches:
    """The same batches at every pass (the validation set)."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(self.batches)


class Regressor(pl.LightningModule):
    """A three-layer MLP (``FEATURES`` -> ``width`` -> ``width`` -> 1), mean squared error."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        width = args.width
        self.net = nn.Sequential(
            nn.Linear(FEATURES, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
            nn.Linear(width, 1),
        )  # fmt: skip

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> Any:
        if self.args.step_delay > 0:
            time.sleep(self.args.step_delay)
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.args.lr)

    def train_dataloader(self) -> SyntheticBatches:
        args = self.args
        stalls = args.stall_rank == self.global_rank and first_attempt()
        return SyntheticBatches(
            steps=args.max_steps,
            batch_size=args.batch_size,
            seed=args.seed,
            rank=self.global_rank,
            stall_at=args.stall_at_step if stalls else None,
        )

    def val_dataloader(self) -> FixedBatches:
        batches = SyntheticBatches(steps=2, batch_size=self.args.batch_size, seed=-1, rank=0)
        return FixedBatches(list(batches))


#: StormwatchCallback's hooks that run in every step (timed by ``--step-times``).
STEP_HOOKS = ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end")


class StepTimes(Callback):
    """Rank 0's wall, CPU (process: all threads) and training-thread CPU seconds of every
    optimizer step, written as JSON at the end (the benchmark's measure; the same in both
    of its variants); with ``hooked`` (the StormwatchCallback) also the training-thread CPU
    seconds its per-step hooks took in each step (``hooks``: the callback's own floor)."""

    def __init__(self, path: Path, hooked: Callback | None = None) -> None:
        self.path = path
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.thread: list[float] = []
        self.hooks: list[float] = []
        self._in_hooks = 0.0
        self._last: tuple[float, float, float] | None = None
        for name in STEP_HOOKS if hooked is not None else ():
            setattr(hooked, name, self._timed(getattr(hooked, name)))

    def _timed(self, hook: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return hook(*args, **kwargs)
            finally:
                self._in_hooks += time.thread_time() - started

        return timed

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        now = (time.perf_counter(), time.process_time(), time.thread_time())
        if self._last is not None:
            self.wall.append(now[0] - self._last[0])
            self.cpu.append(now[1] - self._last[1])
            self.thread.append(now[2] - self._last[2])
            self.hooks.append(self._in_hooks)
        self._in_hooks = 0.0
        self._last = now

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            times = {"wall": self.wall, "cpu": self.cpu, "thread": self.thread}
            times["hooks"] = self.hooks
            self.path.write_text(json.dumps(times))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=50, help="optimizer steps to train")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="0: no checkpoints")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=Path(os.environ.get("STORMWATCH_CHECKPOINT_DIR", "checkpoints")),
        help="[default: $STORMWATCH_CHECKPOINT_DIR, else ./checkpoints]",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
    parser.add_argument("--width", type=int, default=256, help="hidden units")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds slept per step")
    parser.add_argument("--val-every", type=int, default=0, help="validate every N steps")
    parser.add_argument("--no-stormwatch", action="store_true", help="without the callback")
    parser.add_argument("--step-times", type=Path, help="rank 0 writes its step times here")
    parser.add_argument("--stall-rank", type=int, help="this rank's batches stop coming ...")
    parser.add_argument("--stall-at-step", type=int, default=1, help="... at this step")
    args = parser.parse_args(argv)
    for name in ("max_steps", "batch_size", "width"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("checkpoint_every", "val_every", "step_delay"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative")
    return args


def build_trainer(args: argparse.Namespace) -> pl.Trainer:
    """The Lightning ``Trainer``: DDP over gloo on the CPU, checkpoints, the callback."""
    callbacks: list[Callback] = []
    stormwatch: Callback | None = None
    if not args.no_stormwatch:
        from stormwatch.telemetry.integrations.lightning import StormwatchCallback

        stormwatch = StormwatchCallback()
        callbacks.append(stormwatch)
    if args.checkpoint_every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=args.checkpoint_dir,
                every_n_train_steps=args.checkpoint_every,
                save_last="link",
            )
        )
    if args.step_times is not None:
        callbacks.append(StepTimes(args.step_times, stormwatch))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    elastic = TorchElasticEnvironment.detect()
    return pl.Trainer(
        accelerator="cpu",
        devices=local,
        num_nodes=world // local,
        # find_unused_parameters: DDP then keeps its gradient buckets as first laid out
        # (it reorders them after the first iteration of every start otherwise), so a
        # resumed run sums each gradient over the ranks in the same order as an
        # uninterrupted one: over more than two ranks gloo's ring sum depends on where a
        # value sits in its bucket (measured: 4 ranks, a resumed run off by an ulp).
        strategy=DDPStrategy(process_group_backend="gloo", find_unused_parameters=True),
        plugins=[TorchElasticEnvironment()] if elastic else None,
        max_steps=args.max_steps,
        max_epochs=-1,
        limit_val_batches=2 if args.val_every else 0,
        val_check_interval=args.val_every or None,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        deterministic=True,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.checkpoint_dir,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pl.seed_everything(args.seed, workers=True, verbose=False)
    trainer = build_trainer(args)
    resume = "last" if args.checkpoint_every else None
    trainer.fit(Regressor(args), ckpt_path=resume)
    if trainer.is_global_zero:
        print(f"lightning: trained to step {trainer.global_step}", file=sys.stderr)
    # Lightning leaves the process group alive after fit(); destroyed at interpreter exit
    # instead, gloo's threads can still run while C++ statics go, and the process aborts
    # ("terminate called without an active exception", exit -6) after training completed:
    # seen once in benchmarks/lightning_bench.py's quick run (the bare trial, 2026-12-05).
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
