"""The run: :class:`TrainConfig` groups the component configs and checks what spans two of them.

Each component receives only its own config (:class:`ModelConfig` to the model,
:class:`CheckpointConfig` to the checkpointer, ...); :class:`TrainConfig` holds the
run's own settings (steps, parallel degrees, pipeline schedule, step delay) and
checks the constraints that span two configs (e.g. heads divisible by ``tp``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stormwatch.trainer.config.checks import check, check_positive_int
from stormwatch.trainer.config.learning import DataConfig, EvalConfig, ModelConfig, OptimConfig
from stormwatch.trainer.config.options import option
from stormwatch.trainer.config.reporting import TelemetryConfig, TracingConfig
from stormwatch.trainer.config.resilience import CheckpointConfig, ControlConfig, DebugConfig

#: ``--pp-schedule`` values (the keys of :data:`stormwatch.trainer.parallel.pipeline.SCHEDULES`).
PP_SCHEDULES = ("1F1B", "GPipe")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything one ``stormwatch train`` run needs; groups the component configs.

    Attributes:
        steps: last step to run (steps are numbered from 1). A resumed run
            continues after the checkpoint's step up to ``steps``. Required here;
            the CLI's ``--steps`` defaults to 30.
        dp: FSDP2 shard degree (``dp_shard`` of
            :class:`~stormwatch.trainer.parallel.dims.ParallelDims`; the CLI's ``--dp``,
            which defaults to ``auto``: derived from the world size at start).
        tp: tensor-parallel degree; must divide ``model.n_heads`` and ``model.ffn_dim``.
        pp: pipeline-parallel degree (stages); at most ``model.n_layers``.
        dp_replicate: HSDP replica degree (1: plain FSDP2). The data-parallel
            degree the data sees is ``dp_replicate * dp`` (:attr:`dp_total`).
        pp_schedule: ``"1F1B"`` (default) or ``"GPipe"``
            (:data:`stormwatch.trainer.parallel.pipeline.SCHEDULES`).
        pp_microbatches: micro-batches the pipeline cuts each rank's batch
            into; 0 (default) means ``pp``. Divides ``data.micro_batch``;
            ``>= pp`` for 1F1B.
        step_delay: seconds to sleep after each step (to slow a lab run down).

    Raises:
        ConfigError: a value, or a combination of values, is invalid.
    """

    steps: int = option(
        "--steps", cli_default=30, help="Train up to this step (steps count from 1)."
    )
    dp: int = option(
        "--dp",
        default=1,
        cli_default=None,
        auto=True,
        default_text="auto",
        help="Data-parallel (FSDP2 shard) degree, or 'auto': WORLD_SIZE / (pp x dp-replicate x "
        "tp), re-derived at every (elastic) restart.",
    )
    tp: int = option("--tp", default=1, help="Tensor-parallel degree; divides --n-heads.")
    dp_replicate: int = option(
        "--dp-replicate",
        default=1,
        help="HSDP replicas: --dp shards the model inside each replica, gradients are "
        "all-reduced across replicas.",
    )
    pp: int = option("--pp", default=1, help="Pipeline stages (outermost); at most --n-layers.")
    pp_schedule: str = option(
        "--pp-schedule",
        default="1F1B",
        choices=PP_SCHEDULES,
        help="Pipeline schedule (torch.distributed.pipelining).",
    )
    pp_microbatches: int = option(
        "--pp-microbatches",
        default=0,
        help="Pipeline micro-batches per step (used with --pp > 1, checked always); divides "
        "--micro-batch, >= --pp for 1F1B. 0 means --pp.",
    )
    step_delay: float = option(
        "--step-delay",
        default=0.0,
        metavar="SECONDS",
        help="Sleep after each step (slows a lab run down).",
    )
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)

    def __post_init__(self) -> None:
        check_positive_int(self.steps, "steps")
        check_positive_int(self.dp, "dp")
        check_positive_int(self.tp, "tp")
        check(
            isinstance(self.step_delay, (int, float))
            and math.isfinite(self.step_delay)
            and self.step_delay >= 0,
            "step_delay",
            f"must be a finite number of seconds >= 0 (got {self.step_delay!r})",
        )
        check(
            self.model.n_heads % self.tp == 0,
            "tp",
            f"must divide the number of heads (n_heads={self.model.n_heads}, tp={self.tp})",
        )
        check(
            self.model.ffn_dim % self.tp == 0,
            "tp",
            f"must divide the MLP width (d_ff={self.model.ffn_dim}, tp={self.tp})",
        )
        check(
            self.data.seq_len <= self.model.max_seq_len,
            "seq_len",
            f"must be <= model.max_seq_len ({self.data.seq_len} > {self.model.max_seq_len})",
        )
        self.data.accumulation_steps(self.dp_total)  # global batch divisible by micro_batch x dp
        self._check_pipeline()

    @property
    def dp_total(self) -> int:
        """Data-parallel degree the data sees: ``dp_replicate * dp``."""
        return self.dp_replicate * self.dp

    @property
    def microbatches(self) -> int:
        """Pipeline micro-batches per step (``pp_microbatches``, or ``pp`` when 0)."""
        return self.pp_microbatches or self.pp

    def _check_pipeline(self) -> None:
        check_positive_int(self.pp, "pp")
        check_positive_int(self.dp_replicate, "dp_replicate")
        check(
            self.pp_schedule in PP_SCHEDULES,
            "pp_schedule",
            f"must be '1F1B' or 'GPipe' (got {self.pp_schedule!r})",
        )
        check(
            isinstance(self.pp_microbatches, int) and self.pp_microbatches >= 0,
            "pp_microbatches",
            f"must be an integer >= 0, 0 meaning pp (got {self.pp_microbatches!r})",
        )
        if self.pp > 1:
            check(
                self.evaluation.every == 0,
                "eval_every",
                f"evaluation runs the whole model forward, which a pipeline stage "
                f"(pp={self.pp}) does not hold; pass --eval-every 0, or --pp 1",
            )
            check(
                self.pp <= self.model.n_layers,
                "pp",
                f"must be <= n_layers: every stage needs a block (pp={self.pp}, "
                f"n_layers={self.model.n_layers})",
            )
        check(  # as --help says, with or without a pipeline (pp=1 simply does not use it)
            self.data.micro_batch % self.microbatches == 0,
            "pp_microbatches",
            f"must divide micro_batch ({self.data.micro_batch} sequences into "
            f"{self.microbatches} micro-batches); pass --pp-microbatches as a divisor of "
            f"--micro-batch {self.data.micro_batch}, or 0 (= --pp)",
        )
        if self.pp > 1 and self.pp_schedule == "1F1B":
            check(
                self.microbatches >= self.pp,
                "pp_microbatches",
                f"1F1B needs at least pp={self.pp} micro-batches (got {self.microbatches})",
            )


__all__ = ["PP_SCHEDULES", "TrainConfig"]
