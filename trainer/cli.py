"""``stormwatch train``: the reference trainer's command (run it under torchrun).

Every option is validated into :class:`~stormwatch.trainer.config.TrainConfig`
before ``torch`` is imported, so ``--help`` and mistakes are fast.
Precedence: defaults < environment (``STORMWATCH_JOB``,
``STORMWATCH_METRICS_DIR``) < command-line options.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from stormwatch.trainer.config import (
    DEFAULT_CORPUS_MAX_BYTES,
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    TelemetryConfig,
    TrainConfig,
)
from stormwatch.trainer.dims import ParallelDims
from stormwatch.trainer.faults import FaultPoint
from stormwatch.trainer.runtime import RankEnv

from stormwatch.errors import ConfigError

_DIR = click.Path(path_type=Path, file_okay=False, dir_okay=True)


@click.command(
    "train",
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
@click.option("--steps", type=int, default=30, help="Train up to this step (steps count from 1).")
@click.option(
    "--dp", type=int, default=None, help="Data-parallel (FSDP2) degree. [default: WORLD_SIZE / tp]"
)
@click.option("--tp", type=int, default=1, help="Tensor-parallel degree; divides --n-heads.")
@click.option(
    "--checkpoint-dir",
    type=_DIR,
    default=None,
    help="Save/resume DCP checkpoints here (shared by all ranks). Off when unset.",
)
@click.option(
    "--checkpoint-every",
    type=int,
    default=10,
    help="Save after every N-th step (and after the last).",
)
@click.option("--keep", type=int, default=3, help="Complete checkpoints to keep.")
@click.option(
    "--log-dir",
    type=_DIR,
    default=None,
    help="Write per-rank JSON-lines events to <dir>/rank<R>.jsonl.",
)
@click.option(
    "--metrics-dir",
    type=_DIR,
    default=None,
    envvar="STORMWATCH_METRICS_DIR",
    help="prometheus-client multiprocess folder. [env: STORMWATCH_METRICS_DIR]",
)
@click.option(
    "--job",
    default="train",
    envvar="STORMWATCH_JOB",
    help="Job name (metric label). [env: STORMWATCH_JOB]",
)
@click.option("--seed", type=int, default=0, help="Seed for weights, batches and dropout.")
@click.option("--lr", type=float, default=3e-3, help="AdamW learning rate.")
@click.option(
    "--step-delay",
    type=float,
    default=0.0,
    metavar="SECONDS",
    help="Sleep after each step (slows a lab run down).",
)
@click.option(
    "--micro-batch", type=int, default=4, help="Sequences per data-parallel rank per step."
)
@click.option("--seq-len", type=int, default=64, help="Bytes per sequence.")
@click.option("--d-model", type=int, default=64, help="Model width.")
@click.option("--n-heads", type=int, default=4, help="Attention heads.")
@click.option("--n-layers", type=int, default=2, help="Transformer blocks.")
@click.option("--dropout", type=float, default=0.1, help="Dropout probability.")
@click.option(
    "--corpus-max-bytes",
    type=int,
    default=DEFAULT_CORPUS_MAX_BYTES,
    help="Cap on the stdlib corpus.",
)
def train(
    steps: int,
    dp: int | None,
    tp: int,
    checkpoint_dir: Path | None,
    checkpoint_every: int,
    keep: int,
    log_dir: Path | None,
    metrics_dir: Path | None,
    job: str,
    seed: int,
    lr: float,
    step_delay: float,
    micro_batch: int,
    seq_len: int,
    d_model: int,
    n_heads: int,
    n_layers: int,
    dropout: float,
    corpus_max_bytes: int,
) -> int:
    """Train the byte-level LM with FSDP2 x TP; one process per rank.

    \b
    Example (4 CPU ranks, 2-way FSDP x 2-way TP):
      torchrun --nnodes 1 --nproc-per-node 4 --no-python \\
        stormwatch train --dp 2 --tp 2 --steps 30 \\
        --checkpoint-dir ckpt --log-dir logs --metrics-dir metrics

    Without torchrun it runs as a single rank (world size 1). It resumes from
    the latest complete checkpoint in --checkpoint-dir, and writes the
    telemetry described in docs/ARCHITECTURE.md.
    """
    env = RankEnv.from_environ(os.environ)
    if tp < 1:
        raise ConfigError(f"tp: must be an integer >= 1 (got {tp})")
    if dp is None:
        if env.world_size % tp:
            raise ConfigError(
                f"tp: must divide the world size {env.world_size} when --dp is not given (got {tp})"
            )
        dp = env.world_size // tp
    if not env.under_torchrun and dp * tp != 1:
        raise ConfigError(
            f"dp x tp = {dp} x {tp} needs {dp * tp} ranks, but this is a single process; "
            f"run it under torchrun --nproc-per-node {dp * tp} (or use --dp 1 --tp 1)"
        )
    ParallelDims(dp=dp, tp=tp, world_size=env.world_size)  # validate before importing torch
    config = TrainConfig(
        steps=steps,
        dp=dp,
        tp=tp,
        step_delay=step_delay,
        model=ModelConfig(
            d_model=d_model,
            n_heads=n_heads,
            n_layers=n_layers,
            max_seq_len=seq_len,
            dropout=dropout,
        ),
        data=DataConfig(
            seed=seed, seq_len=seq_len, micro_batch=micro_batch, corpus_max_bytes=corpus_max_bytes
        ),
        optim=OptimConfig(lr=lr),
        checkpoint=CheckpointConfig(directory=checkpoint_dir, every=checkpoint_every, keep=keep),
        telemetry=TelemetryConfig(job=job, log_dir=log_dir, metrics_dir=metrics_dir),
    )
    fault = FaultPoint.from_environ(os.environ, rank=env.rank, attempt=env.attempt)

    from stormwatch.trainer.loop import train as run_training  # imports torch (seconds)

    run_training(config, env, fault=fault)
    return 0


__all__ = ["train"]
