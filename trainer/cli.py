"""``stormwatch train``: the reference trainer's command (run it under torchrun).

The options are derived from their declarations on the config fields they set
(:mod:`stormwatch.trainer.config.options`), and every option is validated into
:class:`~stormwatch.trainer.config.TrainConfig` before ``torch`` is imported, so
``--help`` and mistakes are fast. Precedence: defaults < environment
(``STORMWATCH_JOB``, ``STORMWATCH_METRICS_DIR``, ``STORMWATCH_CONTROL_DIR``,
``STORMWATCH_OTLP_ENDPOINT``) < command-line options.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from stormwatch.errors import ConfigError
from stormwatch.trainer.config import (
    CheckpointConfig,
    ControlConfig,
    DataConfig,
    DebugConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    ProgressConfig,
    TelemetryConfig,
    TracingConfig,
    TrainConfig,
    check_otlp_available,
)
from stormwatch.trainer.config.options import (
    click_options,
    declared,
    folder_defaults,
    option_values,
)
from stormwatch.trainer.errors import UnwritableDirError
from stormwatch.trainer.parallel.dims import ParallelDims
from stormwatch.trainer.paths import DirOption, check_writable_dirs
from stormwatch.trainer.progress import ConsoleProgress
from stormwatch.trainer.runtime import RankEnv
from stormwatch.trainer.startup import StartupTimeline, imports_without_gc

log = logging.getLogger(__name__)

#: Seconds a rank that stays quiet about a start-up ConfigError waits before
#: exiting, so that torchrun (which stops the other workers as soon as one
#: exits non-zero) does not kill the reporting rank before it has printed.
QUIET_RANK_EXIT_DELAY = 3.0


@click.command(
    "train",
    params=click_options(TrainConfig, ProgressConfig),
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
def train(**values: Any) -> int:
    """Train the byte-level LM with PP x FSDP2/HSDP x DTensor TP; one process per rank.

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
    env = RankEnv.from_environ(os.environ)
    try:
        return _train(env, values)
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


def _train(env: RankEnv, given: Mapping[str, Any]) -> int:
    """Validate ``given`` (the parsed options), check the output folders, then train.

    Raises:
        ConfigError: an option, a combination of options or the environment is
            invalid, or a folder cannot be written (:class:`UnwritableDirError`).
    """
    values = folder_defaults(TrainConfig, given)
    values["dp"] = _shard_degree(env, given)
    config = _config(values)
    if config.tracing.otlp_endpoint is not None:
        check_otlp_available()  # names the pip package before anything starts
    progress = ConsoleProgress(**option_values(ProgressConfig, values))  # validates --log-every
    check_writable_dirs(_dir_options(config, given, values))
    startup = StartupTimeline.of_this_process()
    startup.mark("cli")

    with imports_without_gc():
        from stormwatch.trainer.loop import train as run_training  # imports torch (seconds)

    startup.mark("imports")
    run_training(config, env, progress=progress if env.rank == 0 else None, startup=startup)
    return 0


def _shard_degree(env: RankEnv, given: Mapping[str, Any]) -> int:
    """``--dp`` (``auto``: the world size over the other degrees), checked against the world size.

    Raises:
        ConfigError: a degree < 1, degrees that do not fit the world size, or
            degrees > 1 outside torchrun.
    """
    tp, pp, dp_replicate = given["tp"], given["pp"], given["dp_replicate"]
    for name, value in (("tp", tp), ("pp", pp), ("dp_replicate", dp_replicate)):
        if value < 1:
            raise ConfigError(f"{name}: must be an integer >= 1 (got {value})")
    others = tp * pp * dp_replicate  # every degree but --dp
    dp: int | None = given["dp"]
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
    return dp


def _config(values: Mapping[str, Any]) -> TrainConfig:
    """The run's config from the options' values (``--seq-len`` also sizes the model).

    Raises:
        ConfigError: from the configs' own checks (messages name the option).
    """

    def part(config: type[Any], **more: Any) -> Any:
        return config(**option_values(config, values), **more)

    return TrainConfig(
        **option_values(TrainConfig, values),
        data=part(DataConfig),  # first: a bad --seq-len is named seq_len, not max_seq_len
        model=part(ModelConfig, max_seq_len=values["seq_len"]),
        optim=part(OptimConfig),
        evaluation=part(EvalConfig),
        checkpoint=part(CheckpointConfig),
        control=part(ControlConfig),
        tracing=part(TracingConfig),
        debug=part(DebugConfig),
        telemetry=part(TelemetryConfig),
    )


def _dir_options(
    config: TrainConfig, given: Mapping[str, Any], values: Mapping[str, Any]
) -> list[DirOption]:
    """Every folder the run writes, named as the user gave it (or where its default came from).

    ``--spans-dir`` only without an OTLP endpoint (spans go to files only then).
    """
    options = []
    for item in declared(TrainConfig, nested=True):
        option = item.option
        if item.kind is not Path or (
            option.name == "spans_dir" and config.tracing.otlp_endpoint is not None
        ):
            continue
        derived = option.default_under is not None and given[option.name] is None
        options.append(
            DirOption(
                option.flags[0], values[option.name], option.default_note if derived else None
            )
        )
    return options


__all__ = ["train"]
