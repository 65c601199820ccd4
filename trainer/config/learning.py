"""What is learned: the model's shape (:class:`ModelConfig`), the batches
(:class:`DataConfig`), the optimizer (:class:`OptimConfig`) and how it is evaluated
(:class:`EvalConfig`).

Defaults are sized for CPU speed (a few milliseconds per step on one core), not
for language-model quality: the trainer is the system under test for
observability and chaos experiments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stormwatch.trainer.config.checks import check, check_positive_int
from stormwatch.trainer.config.options import option

#: Byte-level model: one token per byte value.
VOCAB_SIZE = 256
#: Default corpus cap (bytes). 1 MiB keeps corpus loading well under 100 ms
#: while giving ~16k distinct 64-byte windows per step choice.
DEFAULT_CORPUS_MAX_BYTES = 1 << 20
#: Seeds are in ``[0, SEED_LIMIT)``: what ``torch.manual_seed`` and the batch
#: sampler's derived seeds take (non-negative 64-bit signed integers).
SEED_LIMIT = 2**63


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of the byte-level decoder-only transformer.

    Attributes:
        d_model: residual width (features). Must be divisible by ``n_heads``.
        n_heads: attention heads; with tensor parallelism, divisible by ``tp``.
        n_layers: transformer blocks.
        d_ff: MLP hidden width; ``0`` means ``4 * d_model`` (the GPT-2 ratio). No CLI option.
        max_seq_len: longest sequence (tokens = bytes) the position table covers
            (the CLI sets it to ``--seq-len``).
        dropout: dropout probability in [0, 1). Non-zero by default (0.1) so
            that RNG state is part of what a checkpoint must restore.
    """

    d_model: int = option("--d-model", default=64, help="Model width.")
    n_heads: int = option("--n-heads", default=4, help="Attention heads.")
    n_layers: int = option("--n-layers", default=2, help="Transformer blocks.")
    d_ff: int = 0
    max_seq_len: int = 64
    dropout: float = option("--dropout", default=0.1, help="Dropout probability.")

    def __post_init__(self) -> None:
        # Named as the options are (--d-model: d_model); max_seq_len and d_ff have none.
        for name in ("d_model", "n_heads", "n_layers"):
            check_positive_int(getattr(self, name), name)
        check_positive_int(self.max_seq_len, "model.max_seq_len")
        check(
            isinstance(self.d_ff, int) and self.d_ff >= 0,
            "model.d_ff",
            f"must be an integer >= 0, 0 meaning 4 * d_model (got {self.d_ff!r})",
        )
        check(
            self.d_model % self.n_heads == 0,
            "d_model",
            f"must be divisible by n_heads ({self.d_model} % {self.n_heads} != 0)",
        )
        check(
            isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0,
            "dropout",
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
        seed: base seed, in ``[0, SEED_LIMIT)``; the global batch of step ``s`` is a
            pure function of ``(seed, s, global_batch, micro_batch)``
            (:mod:`stormwatch.trainer.data.batches`).
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

    seed: int = option("--seed", default=0, help="Seed for weights, batches and dropout.")
    seq_len: int = option("--seq-len", default=64, help="Bytes per sequence.")
    micro_batch: int = option(
        "--micro-batch",
        default=4,
        help="Sequences per data-parallel rank per forward/backward pass.",
    )
    global_batch: int | None = option(
        "--global-batch",
        default=None,
        default_text="micro-batch x dp",
        help="Sequences per optimizer step over all data-parallel ranks; a multiple of "
        "micro-batch x dp, the quotient being the gradient-accumulation steps. Keep it fixed "
        "for an elastic job.",
    )
    corpus_max_bytes: int = option(
        "--corpus-max-bytes", default=DEFAULT_CORPUS_MAX_BYTES, help="Cap on the stdlib corpus."
    )

    def __post_init__(self) -> None:
        check(
            isinstance(self.seed, int) and 0 <= self.seed < SEED_LIMIT,
            "seed",
            f"must be an integer in [0, 2**63) (got {self.seed!r})",
        )
        check_positive_int(self.seq_len, "seq_len")
        check_positive_int(self.micro_batch, "micro_batch")
        if self.global_batch is not None:
            check_positive_int(self.global_batch, "global_batch")
        check(
            isinstance(self.corpus_max_bytes, int) and self.corpus_max_bytes > self.seq_len + 1,
            "corpus_max_bytes",
            f"must be an integer > seq_len + 1 = {self.seq_len + 1} (got {self.corpus_max_bytes!r})",
        )
        for name, flag, value in (
            ("global_batch", "--global-batch", self.global_batch),
            ("micro_batch", "--micro-batch", self.micro_batch),
        ):
            check(
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
        check(
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
        weight_decay: decoupled weight decay. No CLI option.
    """

    lr: float = option("--lr", default=3e-3, help="AdamW learning rate.")
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        check(
            isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0,
            "lr",
            f"must be a finite number > 0 (got {self.lr!r})",
        )
        check(
            isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0,
            "optim.weight_decay",
            f"must be >= 0 (got {self.weight_decay!r})",
        )


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Evaluation passes (:mod:`stormwatch.trainer.evaluation`): forward only, over held-out
    batches, marked as the telemetry phase ``eval``.

    Attributes:
        every: evaluate after every ``every``-th step; 0 (the default): never.
        batches: held-out micro-batches each data-parallel rank evaluates per pass (the
            logged loss is their mean over every data-parallel rank).
        delay: seconds to sleep after each evaluation batch, as ``--step-delay`` does after
            a step: stretches a lab evaluation (milliseconds on CPU) into the pause a real
            one makes (minutes), without spending the CPU.
    """

    every: int = option(
        "--eval-every",
        default=0,
        help="Evaluate after every N-th step (forward only, over held-out batches, marked as "
        "the telemetry phase 'eval'); 0: never.",
    )
    batches: int = option(
        "--eval-batches",
        default=4,
        help="Held-out micro-batches each data-parallel rank evaluates per evaluation.",
    )
    delay: float = option(
        "--eval-delay",
        default=0.0,
        metavar="SECONDS",
        help="Sleep after each evaluation batch (stretches a lab evaluation into a real pause).",
    )

    def __post_init__(self) -> None:
        check(
            isinstance(self.every, int) and not isinstance(self.every, bool) and self.every >= 0,
            "eval_every",
            f"must be an integer >= 0, 0 meaning never (got {self.every!r})",
        )
        check_positive_int(self.batches, "eval_batches")
        check(
            isinstance(self.delay, (int, float)) and math.isfinite(self.delay) and self.delay >= 0,
            "eval_delay",
            f"must be a finite number of seconds >= 0 (got {self.delay!r})",
        )


__all__ = [
    "DEFAULT_CORPUS_MAX_BYTES",
    "SEED_LIMIT",
    "VOCAB_SIZE",
    "DataConfig",
    "EvalConfig",
    "ModelConfig",
    "OptimConfig",
]
