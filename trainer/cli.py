"""``stormwatch train``: the reference trainer's command (run it under torchrun).

Every option is validated into :class:`~stormwatch.trainer.config.TrainConfig`
before ``torch`` is imported, so ``--help`` and mistakes are fast.
Precedence: defaults < environment (``STORMWATCH_JOB``,
``STORMWATCH_METRICS_DIR``) < command-line options.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import click

from stormwatch.errors import ConfigError
from stormwatch.trainer.config import (
    DEFAULT_CORPUS_MAX_BYTES,
    CheckpointConfig,
    ControlConfig,
    DataConfig,
    DebugConfig,
    ModelConfig,
    OptimConfig,
    TelemetryConfig,
    TracingConfig,
    TrainConfig,
)
from stormwatch.trainer.parallel.dims import ParallelDims
from stormwatch.trainer.paths import DirOption, UnwritableDirError, check_writable_dirs
from stormwatch.trainer.progress import DEFAULT_LOG_EVERY, ConsoleProgress
from stormwatch.trainer.runtime import RankEnv
from stormwatch.trainer.telemetry.dump import (
    DEFAULT_FLIGHT_RECORDER_ENTRIES,
    flight_recorder_environ,
)

log = logging.getLogger(__name__)

_DIR = click.Path(path_type=Path, file_okay=False, dir_okay=True)


class _DpType(click.ParamType):
    """``--dp``: a positive integer or ``auto`` (``None``: derived from the world size)."""

    name = "INTEGER|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return None
        try:
            degree = int(value)
        except ValueError:
            self.fail(f"{value!r} is neither an integer nor 'auto'", param, ctx)
        if degree < 1:
            self.fail(f"{degree} is not a degree: give an integer >= 1, or 'auto'", param, ctx)
        return degree


_DP = _DpType()

#: Seconds a rank that stays quiet about a start-up ConfigError waits before
#: exiting, so that torchrun (which stops the other workers as soon as one
#: exits non-zero) does not kill the reporting rank before it has printed.
QUIET_RANK_EXIT_DELAY = 3.0


@click.command(
    "train",
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
@click.option("--steps", type=int, default=30, help="Train up to this step (steps count from 1).")
@click.option(
    "--dp",
    type=_DP,
    default=None,
    help="Data-parallel (FSDP2 shard) degree, or 'auto': WORLD_SIZE / (pp x dp-replicate x "
    "tp), re-derived at every (elastic) restart. [default: auto]",
)
@click.option("--tp", type=int, default=1, help="Tensor-parallel degree; divides --n-heads.")
@click.option(
    "--dp-replicate",
    type=int,
    default=1,
    help="HSDP replicas: --dp shards the model inside each replica, gradients are "
    "all-reduced across replicas.",
)
@click.option("--pp", type=int, default=1, help="Pipeline stages (outermost); at most --n-layers.")
@click.option(
    "--pp-schedule",
    type=click.Choice(["1F1B", "GPipe"]),
    default="1F1B",
    help="Pipeline schedule (torch.distributed.pipelining).",
)
@click.option(
    "--pp-microbatches",
    type=int,
    default=0,
    help="Pipeline micro-batches per step; divides --micro-batch, >= --pp for 1F1B. 0 means --pp.",
)
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
    "--checkpoint-failures-allowed",
    type=click.IntRange(0, 1000),
    default=3,
    show_default=True,
    help="Failed saves in a row (disk full, read-only, I/O error) the job trains through; "
    "one more stops it. 0: stop at the first failed save.",
)
@click.option(
    "--checkpoint-mode",
    type=click.Choice(["sync", "async"]),
    default="sync",
    help="sync: training waits for each save; async: dcp.async_save, committed when "
    "every rank's write has finished.",
)
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
    "--micro-batch",
    type=int,
    default=4,
    help="Sequences per data-parallel rank per forward/backward pass.",
)
@click.option(
    "--global-batch",
    type=int,
    default=None,
    help="Sequences per optimizer step over all data-parallel ranks; a multiple of "
    "micro-batch x dp, the quotient being the gradient-accumulation steps. Keep it fixed "
    "for an elastic job. [default: micro-batch x dp]",
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
@click.option(
    "--peak-flops",
    type=float,
    default=None,
    metavar="FLOPS",
    help="Peak FLOP/s of one device for MFU. [default: by GPU name; CPU: nominal 1e11]",
)
@click.option(
    "--control-dir",
    type=_DIR,
    default=None,
    envvar="STORMWATCH_CONTROL_DIR",
    help="Chaos control files <dir>/rank<R>.json, polled once per step. "
    "[default: <metrics-dir>/control; env: STORMWATCH_CONTROL_DIR]",
)
@click.option(
    "--dump-dir",
    type=_DIR,
    default=None,
    help="Per-rank post-mortem dumps on hang, timeout or fatal error. [default: <log-dir>/dumps]",
)
@click.option(
    "--collective-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="A collective not complete after this fails the rank. [default: 120 on GPU, 300 on CPU]",
)
@click.option(
    "--flight-recorder-entries",
    type=int,
    default=DEFAULT_FLIGHT_RECORDER_ENTRIES,
    help="PyTorch flight-recorder ring size (TORCH_FR_BUFFER_SIZE unless set); 0: off.",
)
@click.option(
    "--otlp-endpoint",
    default=None,
    envvar="STORMWATCH_OTLP_ENDPOINT",
    metavar="URL",
    help="Export spans over OTLP/HTTP (needs opentelemetry-exporter-otlp-proto-http). "
    "[env: STORMWATCH_OTLP_ENDPOINT]",
)
@click.option(
    "--spans-dir",
    type=_DIR,
    default=None,
    help="Write spans as JSON lines to <dir>/rank<R>.jsonl when no OTLP endpoint is set. "
    "[default: <log-dir>/spans]",
)
@click.option(
    "--trace-flush-timeout",
    type=float,
    default=2.0,
    metavar="SECONDS",
    help="Longest wait for the span export at exit.",
)
@click.option(
    "--log-every",
    type=int,
    default=DEFAULT_LOG_EVERY,
    metavar="N",
    help="Progress line on stderr (rank 0) every N steps and at the last step.",
)
@click.option(
    "--quiet", "-q", is_flag=True, help="No progress lines on stderr (warnings still shown)."
)
def train(
    steps: int,
    dp: int | None,
    tp: int,
    dp_replicate: int,
    pp: int,
    pp_schedule: str,
    pp_microbatches: int,
    checkpoint_dir: Path | None,
    checkpoint_every: int,
    keep: int,
    checkpoint_failures_allowed: int,
    checkpoint_mode: str,
    log_dir: Path | None,
    metrics_dir: Path | None,
    job: str,
    seed: int,
    lr: float,
    step_delay: float,
    micro_batch: int,
    global_batch: int | None,
    seq_len: int,
    d_model: int,
    n_heads: int,
    n_layers: int,
    dropout: float,
    corpus_max_bytes: int,
    peak_flops: float | None,
    control_dir: Path | None,
    dump_dir: Path | None,
    collective_timeout: float | None,
    flight_recorder_entries: int,
    otlp_endpoint: str | None,
    spans_dir: Path | None,
    trace_flush_timeout: float,
    log_every: int,
    quiet: bool,
) -> int:
    """Train the byte-level LM with FSDP2 x TP; one process per rank.

    \b
    Example (4 CPU ranks, 2-way FSDP x 2-way TP):
      torchrun --nnodes 1 --nproc-per-node 4 --no-python \\
        stormwatch train --dp 2 --tp 2 --steps 30 \\
        --checkpoint-dir ckpt --log-dir logs --metrics-dir metrics

    \b
    Elastic (1 to 2 nodes of 2 ranks; run on each node; dp follows the world size,
    the global batch stays 8 sequences, so a resize continues the same optimisation):
      torchrun --nnodes 1:2 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint HOST0:29500 --rdzv-id job1 --max-restarts 3 --no-python \\
        stormwatch train --dp auto --tp 1 --micro-batch 2 --global-batch 8 ...

    Without torchrun it runs as a single rank (world size 1). It resumes from
    the latest complete checkpoint in --checkpoint-dir, and writes the
    telemetry described in docs/ARCHITECTURE.md. Rank 0 prints progress
    lines to stderr (--log-every, --quiet).

    Mistakes in the options are reported once, by rank 0 (a folder that cannot
    be written: by the first rank of each node that has the problem), and
    every rank exits with status 2. Under torchrun, torchrun then prints its
    own ChildFailedError summary after our message; that output is torchrun's.
    """
    options: dict[str, Any] = dict(locals())  # the click parameters, passed on as they are
    env = RankEnv.from_environ(os.environ)
    try:
        return _train(env, **options)
    except ConfigError as exc:
        if _reports(env, exc):
            raise
        # The same mistake is reported by rank 0 (or this node's first rank):
        # once, instead of once per rank before torchrun's own summary.
        log.debug("rank %d: %s", env.rank, exc)
        time.sleep(QUIET_RANK_EXIT_DELAY)
        return exc.exit_code


def _reports(env: RankEnv, exc: ConfigError) -> bool:
    """Whether this rank prints ``exc`` (the others exit quietly with the same status)."""
    if not env.under_torchrun:
        return True
    if isinstance(exc, UnwritableDirError):  # may differ from node to node
        return env.local_rank == 0
    return env.rank == 0


def _train(
    env: RankEnv,
    *,
    steps: int,
    dp: int | None,
    tp: int,
    dp_replicate: int,
    pp: int,
    pp_schedule: str,
    pp_microbatches: int,
    checkpoint_dir: Path | None,
    checkpoint_every: int,
    keep: int,
    checkpoint_failures_allowed: int,
    checkpoint_mode: str,
    log_dir: Path | None,
    metrics_dir: Path | None,
    job: str,
    seed: int,
    lr: float,
    step_delay: float,
    micro_batch: int,
    global_batch: int | None,
    seq_len: int,
    d_model: int,
    n_heads: int,
    n_layers: int,
    dropout: float,
    corpus_max_bytes: int,
    peak_flops: float | None,
    control_dir: Path | None,
    dump_dir: Path | None,
    collective_timeout: float | None,
    flight_recorder_entries: int,
    otlp_endpoint: str | None,
    spans_dir: Path | None,
    trace_flush_timeout: float,
    log_every: int,
    quiet: bool,
) -> int:
    for name, value in (("tp", tp), ("pp", pp), ("dp_replicate", dp_replicate)):
        if value < 1:
            raise ConfigError(f"{name}: must be an integer >= 1 (got {value})")
    others = tp * pp * dp_replicate  # every degree but --dp
    if dp is None and not env.under_torchrun:
        dp = 1  # a single process: any other degree > 1 is reported just below
    if dp is None:
        if env.world_size % others:
            raise ConfigError(
                f"pp x dp_replicate x tp = {pp} x {dp_replicate} x {tp} = {others}: must divide "
                f"the world size {env.world_size} when --dp is not given"
            )
        dp = env.world_size // others
    if not env.under_torchrun and dp * others != 1:
        raise ConfigError(
            f"pp x dp_replicate x dp x tp = {pp} x {dp_replicate} x {dp} x {tp} needs "
            f"{dp * others} ranks, but this is a single process; run it under torchrun "
            f"--nproc-per-node {dp * others} (or leave all degrees at 1)"
        )
    # validate before importing torch
    ParallelDims(pp=pp, dp_replicate=dp_replicate, dp_shard=dp, tp=tp, world_size=env.world_size)
    config = TrainConfig(
        steps=steps,
        dp=dp,
        tp=tp,
        pp=pp,
        dp_replicate=dp_replicate,
        pp_schedule=pp_schedule,
        pp_microbatches=pp_microbatches,
        step_delay=step_delay,
        model=ModelConfig(
            d_model=d_model,
            n_heads=n_heads,
            n_layers=n_layers,
            max_seq_len=seq_len,
            dropout=dropout,
        ),
        data=DataConfig(
            seed=seed,
            seq_len=seq_len,
            micro_batch=micro_batch,
            global_batch=global_batch,
            corpus_max_bytes=corpus_max_bytes,
        ),
        optim=OptimConfig(lr=lr),
        checkpoint=CheckpointConfig(
            directory=checkpoint_dir,
            every=checkpoint_every,
            keep=keep,
            mode=checkpoint_mode,
            failures_allowed=checkpoint_failures_allowed,
        ),
        control=ControlConfig(
            directory=control_dir
            if control_dir is not None or metrics_dir is None
            else metrics_dir / "control"
        ),
        tracing=TracingConfig(
            otlp_endpoint=otlp_endpoint,
            spans_dir=spans_dir if spans_dir is not None or log_dir is None else log_dir / "spans",
            flush_timeout=trace_flush_timeout,
        ),
        debug=DebugConfig(
            dump_dir=dump_dir if dump_dir is not None or log_dir is None else log_dir / "dumps",
            collective_timeout=collective_timeout,
            flight_recorder_entries=flight_recorder_entries,
        ),
        telemetry=TelemetryConfig(
            job=job, log_dir=log_dir, metrics_dir=metrics_dir, peak_flops=peak_flops
        ),
    )
    if config.tracing.otlp_endpoint is not None:
        from stormwatch.trainer.telemetry.tracing import check_otlp_available

        check_otlp_available()  # names the pip package before anything starts
    progress = ConsoleProgress(every=log_every, quiet=quiet)  # validates --log-every
    check_writable_dirs(
        _dir_options(config, control_dir=control_dir, dump_dir=dump_dir, spans_dir=spans_dir)
    )
    # The flight recorder reads these when the process group is created.
    os.environ.update(
        flight_recorder_environ(config.debug.dump_dir, config.debug.flight_recorder_entries)
    )

    from stormwatch.trainer.loop import train as run_training  # imports torch (seconds)

    run_training(config, env, progress=progress if env.rank == 0 else None)
    return 0


def _dir_options(
    config: TrainConfig,
    *,
    control_dir: Path | None,
    dump_dir: Path | None,
    spans_dir: Path | None,
) -> list[DirOption]:
    """Every folder the run writes, named as the user gave it (or where its default came from)."""
    options = [
        DirOption("--checkpoint-dir", config.checkpoint.directory),
        DirOption("--log-dir", config.telemetry.log_dir),
        DirOption("--metrics-dir", config.telemetry.metrics_dir),
        DirOption(
            "--control-dir",
            config.control.directory,
            None if control_dir is not None else "<metrics-dir>/control",
        ),
        DirOption(
            "--dump-dir", config.debug.dump_dir, None if dump_dir is not None else "<log-dir>/dumps"
        ),
    ]
    if config.tracing.otlp_endpoint is None:  # spans go to files only without an endpoint
        options.append(
            DirOption(
                "--spans-dir",
                config.tracing.spans_dir,
                None if spans_dir is not None else "<log-dir>/spans",
            )
        )
    return options


__all__ = ["train"]
