"""Small frozen configs, one per trainer component, validated at construction.

No torch import here: the CLI validates every option before it pays for
``import torch``. Each component receives only its own config
(:class:`ModelConfig` to the model, :class:`CheckpointConfig` to the
checkpointer, ...); :class:`TrainConfig` only groups them for the loop and
checks the constraints that span two of them (e.g. heads divisible by ``tp``).

Defaults are sized for CPU speed (a few milliseconds per step on one core), not
for language-model quality: the trainer is the system under test for
observability and chaos experiments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from stormwatch.errors import ConfigError

#: Byte-level model: one token per byte value.
VOCAB_SIZE = 256
#: Default corpus cap (bytes). 1 MiB keeps corpus loading well under 100 ms
#: while giving ~16k distinct 64-byte windows per step choice.
DEFAULT_CORPUS_MAX_BYTES = 1 << 20


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{name}: {message}")


def _check_positive_int(value: int, name: str) -> None:
    _check(
        isinstance(value, int) and not isinstance(value, bool) and value >= 1,
        name,
        f"must be an integer >= 1 (got {value!r})",
    )


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of the byte-level decoder-only transformer.

    Attributes:
        d_model: residual width (features). Must be divisible by ``n_heads``.
        n_heads: attention heads; with tensor parallelism, divisible by ``tp``.
        n_layers: transformer blocks.
        d_ff: MLP hidden width; ``0`` means ``4 * d_model`` (the GPT-2 ratio).
        max_seq_len: longest sequence (tokens = bytes) the position table covers.
        dropout: dropout probability in [0, 1). Non-zero by default (0.1) so
            that RNG state is part of what a checkpoint must restore.
    """

    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 0
    max_seq_len: int = 64
    dropout: float = 0.1

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers", "max_seq_len"):
            _check_positive_int(getattr(self, name), f"model.{name}")
        _check(
            isinstance(self.d_ff, int) and self.d_ff >= 0,
            "model.d_ff",
            f"must be an integer >= 0, 0 meaning 4 * d_model (got {self.d_ff!r})",
        )
        _check(
            self.d_model % self.n_heads == 0,
            "model.d_model",
            f"must be divisible by n_heads ({self.d_model} % {self.n_heads} != 0)",
        )
        _check(
            isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0,
            "model.dropout",
            f"must be in [0, 1) (got {self.dropout!r})",
        )

    @property
    def ffn_dim(self) -> int:
        """MLP hidden width actually used (``d_ff`` or ``4 * d_model``)."""
        return self.d_ff or 4 * self.d_model

    @property
    def head_dim(self) -> int:
        """Features per attention head."""
        return self.d_model // self.n_heads


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Batch sampling over the byte corpus.

    Attributes:
        seed: base seed; the global batch of step ``s`` is a pure function of
            ``(seed, s, global_batch, micro_batch)`` (:mod:`stormwatch.trainer.data.batches`).
        seq_len: tokens (bytes) per sequence.
        micro_batch: sequences per data-parallel rank per forward/backward pass.
        global_batch: sequences per optimizer step across all data-parallel
            ranks; ``None`` means ``micro_batch * dp`` (no accumulation). Must
            be a multiple of ``micro_batch * dp``; the quotient is the number
            of gradient-accumulation steps (:meth:`accumulation_steps`). Kept
            constant across an elastic resize so the optimisation is unchanged
            (:mod:`stormwatch.trainer.data.batches`). At most :attr:`max_batch`: the
            corpus's distinct sequences.
        corpus_max_bytes: cap on the corpus size (default 1 MiB, see
            :data:`DEFAULT_CORPUS_MAX_BYTES`).
    """

    seed: int = 0
    seq_len: int = 64
    micro_batch: int = 4
    global_batch: int | None = None
    corpus_max_bytes: int = DEFAULT_CORPUS_MAX_BYTES

    def __post_init__(self) -> None:
        _check(
            isinstance(self.seed, int) and 0 <= self.seed < 2**63,
            "seed",
            f"must be an integer in [0, 2**63) (got {self.seed!r})",
        )
        _check_positive_int(self.seq_len, "data.seq_len")
        _check_positive_int(self.micro_batch, "data.micro_batch")
        if self.global_batch is not None:
            _check_positive_int(self.global_batch, "global_batch")
        _check(
            isinstance(self.corpus_max_bytes, int) and self.corpus_max_bytes > self.seq_len + 1,
            "data.corpus_max_bytes",
            f"must be an integer > seq_len + 1 = {self.seq_len + 1} (got {self.corpus_max_bytes!r})",
        )
        for name, flag, value in (
            ("global_batch", "--global-batch", self.global_batch),
            ("data.micro_batch", "--micro-batch", self.micro_batch),
        ):
            _check(
                value is None or value <= self.max_batch,
                name,
                f"{value} sequences is more than the corpus has distinct ones "
                f"(corpus_max_bytes - seq_len - 1 = {self.corpus_max_bytes} - {self.seq_len} - 1 "
                f"= {self.max_batch}), so one step would train on repeats; pass {flag} <= "
                f"{self.max_batch} (or a larger --corpus-max-bytes)",
            )

    @property
    def max_batch(self) -> int:
        """The largest ``global_batch`` (and ``micro_batch``): the corpus's distinct sequences.

        A sequence is a window of ``seq_len + 1`` bytes starting at one of
        ``len(corpus) - seq_len - 1`` offsets (:mod:`stormwatch.trainer.data.batches`), and the
        corpus holds at most ``corpus_max_bytes``; a larger batch could only repeat
        windows within one step (and would spend hours building one step's batch).
        """
        return self.corpus_max_bytes - self.seq_len - 1

    def accumulation_steps(self, dp: int) -> int:
        """Gradient-accumulation steps ``global_batch / (micro_batch * dp)`` (1 by default).

        Args:
            dp: data-parallel degree (all data-parallel axes together).

        Raises:
            ConfigError: ``global_batch`` is not a multiple of ``micro_batch * dp``.
        """
        if self.global_batch is None:
            return 1
        per_pass = self.micro_batch * dp
        _check(
            self.global_batch % per_pass == 0,
            "global_batch",
            f"{self.global_batch} is not a multiple of micro_batch x dp = {self.micro_batch} x "
            f"{dp} = {per_pass}; pass --global-batch as a multiple of {per_pass} (for an elastic "
            "job: of micro_batch x every dp it may run at) or change --micro-batch",
        )
        return self.global_batch // per_pass


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW settings.

    Attributes:
        lr: learning rate (constant schedule). 3e-3 suits the tiny default model.
        weight_decay: decoupled weight decay.
    """

    lr: float = 3e-3
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        _check(
            isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0,
            "lr",
            f"must be a finite number > 0 (got {self.lr!r})",
        )
        _check(
            isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0,
            "optim.weight_decay",
            f"must be >= 0 (got {self.weight_decay!r})",
        )


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Where and how often to write DCP checkpoints.

    Attributes:
        directory: checkpoint root; ``None`` disables saving and resuming.
        every: save after every ``every``-th step (and never at step 0).
        keep: number of complete checkpoints to keep (default 3); older ones
            are deleted only after a newer one is complete (FC-11).
        mode: ``"sync"`` (default: training waits for the save) or
            ``"async"`` (``dcp.async_save``: training goes on while a
            background thread writes; committed once every rank's write
            has finished, see :mod:`stormwatch.trainer.checkpoint.checkpointer`).
        failures_allowed: failed saves in a row the job trains through (each is
            counted and logged, the partial folder is left for the next resume's
            clean-up); one more stops the job with the last error. 0: the first
            failed save stops it.
    """

    directory: Path | None = None
    every: int = 10
    keep: int = 3
    mode: str = "sync"
    failures_allowed: int = 3

    def __post_init__(self) -> None:
        _check(
            self.mode in ("sync", "async"),
            "checkpoint_mode",
            f"must be 'sync' or 'async' (got {self.mode!r})",
        )
        _check_positive_int(self.every, "checkpoint_every")
        _check_positive_int(self.keep, "keep")
        _check(
            isinstance(self.failures_allowed, int) and self.failures_allowed >= 0,
            "checkpoint_failures_allowed",
            f"must be an integer >= 0 (got {self.failures_allowed!r})",
        )
        if self.directory is not None and self.directory.exists():
            _check(
                self.directory.is_dir(),
                "checkpoint_dir",
                f"{self.directory} exists and is not a directory",
            )


@dataclass(frozen=True, kw_only=True)
class TelemetryConfig:
    """Per-rank telemetry outputs (see docs/ARCHITECTURE.md "Trainer -> agent telemetry").

    Attributes:
        job: value of the ``job`` label and of the log records.
        log_dir: folder for ``rank<R>.jsonl``; ``None`` disables the event log.
        metrics_dir: prometheus-client multiprocess folder; ``None`` disables metrics.
        peak_flops: peak FLOP/s of one device for MFU; ``None`` looks the device
            up in :data:`stormwatch.trainer.telemetry.perf.PEAK_FLOPS_BY_DEVICE` (on CPU:
            the nominal :data:`~stormwatch.trainer.telemetry.perf.CPU_NOMINAL_PEAK_FLOPS`).
        count_collectives: count and time every collective (the
            :class:`~stormwatch.trainer.telemetry.comms.CollectiveCounter`: collective
            metrics, the compute/wait split, the dump's recent collectives).
            ``False`` only for the "bare" trainer of ``benchmarks/trainer_bench.py``
            (the instrumentation-overhead baseline); no CLI option.
    """

    job: str = "train"
    log_dir: Path | None = None
    metrics_dir: Path | None = None
    peak_flops: float | None = None
    count_collectives: bool = True

    def __post_init__(self) -> None:
        _check(
            bool(self.job) and self.job.isprintable() and len(self.job) <= 128,
            "job",
            f"must be a non-empty printable string of at most 128 characters (got {self.job!r})",
        )
        if self.peak_flops is not None:
            _check(
                isinstance(self.peak_flops, (int, float))
                and math.isfinite(self.peak_flops)
                and self.peak_flops > 0,
                "peak_flops",
                f"must be a finite number of FLOP/s > 0, e.g. 989e12 (got {self.peak_flops!r})",
            )
        for name in ("log_dir", "metrics_dir"):
            path = getattr(self, name)
            if path is not None and path.exists():
                _check(path.is_dir(), name, f"{path} exists and is not a directory")


@dataclass(frozen=True, kw_only=True)
class ControlConfig:
    """Where the chaos control channel reads fault points (:mod:`stormwatch.trainer.control`).

    Attributes:
        directory: folder of the per-rank ``rank<R>.json`` files; ``None``
            disables the channel (the CLI defaults it to ``<metrics-dir>/control``).
    """

    directory: Path | None = None

    def __post_init__(self) -> None:
        if self.directory is not None and self.directory.exists():
            _check(
                self.directory.is_dir(),
                "control_dir",
                f"{self.directory} exists and is not a directory",
            )


@dataclass(frozen=True, kw_only=True)
class DebugConfig:
    """Bounded failure on hangs and post-mortem dumps (FC-10, :mod:`stormwatch.trainer.telemetry.dump`).

    Attributes:
        dump_dir: where each rank writes ``rank<R>.json`` when training ends
            abnormally; ``None`` disables dumps (the CLI defaults it to
            ``<log-dir>/dumps``).
        collective_timeout: seconds after which a collective that has not
            completed fails the rank; ``None``: 120 s on GPU, 300 s on CPU
            (:mod:`stormwatch.trainer.runtime`).
        flight_recorder_entries: PyTorch flight-recorder ring size (0: leave
            the recorder off unless the environment enables it).
    """

    dump_dir: Path | None = None
    collective_timeout: float | None = None
    flight_recorder_entries: int = 2000

    def __post_init__(self) -> None:
        if self.collective_timeout is not None:
            _check(
                isinstance(self.collective_timeout, (int, float))
                and math.isfinite(self.collective_timeout)
                and self.collective_timeout >= 1,
                "collective_timeout",
                f"must be a number of seconds >= 1 (got {self.collective_timeout!r})",
            )
        _check(
            isinstance(self.flight_recorder_entries, int) and self.flight_recorder_entries >= 0,
            "flight_recorder_entries",
            f"must be an integer >= 0 (got {self.flight_recorder_entries!r})",
        )
        if self.dump_dir is not None and self.dump_dir.exists():
            _check(self.dump_dir.is_dir(), "dump_dir", f"{self.dump_dir} is not a directory")


@dataclass(frozen=True, kw_only=True)
class TracingConfig:
    """Where OpenTelemetry spans go (:mod:`stormwatch.trainer.telemetry.tracing`).

    Attributes:
        otlp_endpoint: OTLP/HTTP traces URL (e.g. ``http://127.0.0.1:4318/v1/traces``);
            takes precedence over ``spans_dir``.
        spans_dir: folder for per-rank ``rank<R>.jsonl`` span files (the CLI
            defaults it to ``<log-dir>/spans``).
        flush_timeout: seconds the exit path waits for the export (default
            2 s: a few seconds at most added to an exit, FC-08).
    """

    otlp_endpoint: str | None = None
    spans_dir: Path | None = None
    flush_timeout: float = 2.0

    def __post_init__(self) -> None:
        if self.otlp_endpoint is not None:
            _check(
                self.otlp_endpoint.startswith(("http://", "https://")),
                "otlp_endpoint",
                "must be an http(s) URL such as http://127.0.0.1:4318/v1/traces "
                f"(got {self.otlp_endpoint!r})",
            )
        _check(
            isinstance(self.flush_timeout, (int, float)) and 0 < self.flush_timeout <= 60,
            "trace_flush_timeout",
            f"must be in (0, 60] seconds (got {self.flush_timeout!r})",
        )

    @property
    def enabled(self) -> bool:
        """True when spans are exported somewhere."""
        return self.otlp_endpoint is not None or self.spans_dir is not None


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything one ``stormwatch train`` run needs; groups the component configs.

    Attributes:
        steps: last step to run (steps are numbered from 1). A resumed run
            continues after the checkpoint's step up to ``steps``.
        dp: FSDP2 shard degree (``dp_shard`` of
            :class:`~stormwatch.trainer.parallel.dims.ParallelDims`; the CLI's ``--dp``).
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

    steps: int
    dp: int = 1
    tp: int = 1
    pp: int = 1
    dp_replicate: int = 1
    pp_schedule: str = "1F1B"
    pp_microbatches: int = 0
    step_delay: float = 0.0
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)

    def __post_init__(self) -> None:
        _check_positive_int(self.steps, "steps")
        _check_positive_int(self.dp, "dp")
        _check_positive_int(self.tp, "tp")
        _check(
            isinstance(self.step_delay, (int, float))
            and math.isfinite(self.step_delay)
            and self.step_delay >= 0,
            "step_delay",
            f"must be a finite number of seconds >= 0 (got {self.step_delay!r})",
        )
        _check(
            self.model.n_heads % self.tp == 0,
            "tp",
            f"must divide the number of heads (n_heads={self.model.n_heads}, tp={self.tp})",
        )
        _check(
            self.model.ffn_dim % self.tp == 0,
            "tp",
            f"must divide the MLP width (d_ff={self.model.ffn_dim}, tp={self.tp})",
        )
        _check(
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
        _check_positive_int(self.pp, "pp")
        _check_positive_int(self.dp_replicate, "dp_replicate")
        _check(
            self.pp_schedule in ("1F1B", "GPipe"),
            "pp_schedule",
            f"must be '1F1B' or 'GPipe' (got {self.pp_schedule!r})",
        )
        _check(
            isinstance(self.pp_microbatches, int) and self.pp_microbatches >= 0,
            "pp_microbatches",
            f"must be an integer >= 0, 0 meaning pp (got {self.pp_microbatches!r})",
        )
        if self.pp == 1:
            return
        _check(
            self.pp <= self.model.n_layers,
            "pp",
            f"must be <= n_layers: every stage needs a block (pp={self.pp}, "
            f"n_layers={self.model.n_layers})",
        )
        _check(
            self.data.micro_batch % self.microbatches == 0,
            "pp_microbatches",
            f"must divide micro_batch ({self.data.micro_batch} sequences into "
            f"{self.microbatches} micro-batches)",
        )
        if self.pp_schedule == "1F1B":
            _check(
                self.microbatches >= self.pp,
                "pp_microbatches",
                f"1F1B needs at least pp={self.pp} micro-batches (got {self.microbatches})",
            )


__all__ = [
    "DEFAULT_CORPUS_MAX_BYTES",
    "VOCAB_SIZE",
    "CheckpointConfig",
    "ControlConfig",
    "DataConfig",
    "DebugConfig",
    "ModelConfig",
    "OptimConfig",
    "TelemetryConfig",
    "TracingConfig",
    "TrainConfig",
]
