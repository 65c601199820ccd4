"""Deterministic, data-parallel-independent batches (constant global batch, elastic resize).

Samples are numbered globally. Step ``s`` (counted from 1) consumes the
*global batch* of ``G`` samples ``[(s-1)*G, s*G)``; sample ``i`` is the window
of ``seq_len + 1`` corpus bytes starting at ``derive_seed("sample", seed, i)
mod (len(corpus) - seq_len - 1)``. The global batch is cut into
``G / micro_batch`` *micro-batches* (micro-batch ``k`` holds samples
``(s-1)*G + k*micro_batch ...``); data-parallel rank ``r`` of ``dp`` runs
micro-batches ``r*A ... r*A + A - 1`` one after the other, accumulating
gradients, where ``A = G / (micro_batch * dp)`` is the number of
gradient-accumulation steps (:meth:`DataConfig.accumulation_steps`).

So what step ``s`` trains on depends on ``(seed, s, G, micro_batch)`` only,
never on ``dp``: a job resized from ``dp=2`` to ``dp=1`` (with twice the
accumulation steps) continues the same optimisation, and the sampler's saved
state (:meth:`BatchSampler.state_dict`) is the same on every rank and at every
``dp``. Ranks of one tensor-parallel group share a data-parallel rank and
therefore see the same micro-batches. Each micro-batch also names a dropout
seed (:attr:`MicroBatch.dropout_seed`), so dropout masks do not depend on
``dp`` either.

The evaluation set (:meth:`BatchSampler.held_out`) is a stream of its own: sample ``i`` of
it starts at ``derive_seed("eval", seed, i) mod (len(corpus) - seq_len - 1)``. Training
never draws from it, and reading it neither advances the sampler nor touches a random
generator, so evaluating leaves the training batches (and a resume) exactly as they were.
Its windows are not disjoint from the training windows: both are drawn from the whole
corpus (splitting it would change every training batch), so the evaluation loss
measures a fixed sample, not generalisation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from stormwatch.trainer.config import DataConfig
from stormwatch.trainer.data.corpus import Corpus
from stormwatch.trainer.errors import CheckpointError, CorpusError


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from a tuple of values (SHA-256 of their ``repr``), stable across runs.

    Unlike :func:`hash`, the result does not depend on ``PYTHONHASHSEED``.
    """
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of a step.

    Attributes:
        index: position ``k`` in the step's global batch (``0 <= k < G / micro_batch``).
        inputs: ``int64`` ``[micro_batch, seq_len]`` byte values 0..255.
        targets: ``inputs`` shifted by one byte, same shape.
        dropout_seed: seed for the CPU/CUDA generators before this micro-batch's
            forward pass (a function of ``(seed, step, index)``).
    """

    index: int
    inputs: torch.Tensor
    targets: torch.Tensor
    dropout_seed: int


class BatchSampler:
    """Hands each data-parallel rank its micro-batches of each training step.

    Args:
        corpus: the byte corpus; must be longer than ``config.seq_len + 1``.
        config: seed, shapes and global batch.
        dp: data-parallel degree of this run.
        dp_rank: this rank's data-parallel index (``0 <= dp_rank < dp``).

    Raises:
        CorpusError: the corpus is too short for one window.
        ConfigError: ``config.global_batch`` is not a multiple of ``micro_batch * dp``.
    """

    def __init__(self, corpus: Corpus, *, config: DataConfig, dp: int, dp_rank: int) -> None:
        if len(corpus) < config.seq_len + 2:
            raise CorpusError(
                f"corpus has {len(corpus)} bytes; need at least seq_len + 2 = {config.seq_len + 2}"
            )
        if not 0 <= dp_rank < dp:
            raise ValueError(f"dp_rank must be in [0, {dp}) (got {dp_rank})")
        self._config = config
        self._dp_rank = dp_rank
        self.accumulation_steps = config.accumulation_steps(dp)
        self.global_batch = config.micro_batch * dp * self.accumulation_steps
        self._corpus_sha256 = corpus.sha256
        # bytearray: frombuffer needs a writable buffer to avoid a warning.
        self._tokens = torch.frombuffer(bytearray(corpus.data), dtype=torch.uint8)
        self._offsets = torch.arange(config.seq_len + 1)
        self.next_step = 1

    def sample_starts(self, first: int, count: int, *, stream: str = "sample") -> torch.Tensor:
        """Corpus offsets of samples ``first .. first + count - 1`` (``int64 [count]``) of
        ``stream``: ``sample`` (training) or ``eval`` (the evaluation set)."""
        cfg = self._config
        high = self._tokens.numel() - cfg.seq_len - 1
        return torch.tensor(
            [derive_seed(stream, cfg.seed, i) % high for i in range(first, first + count)],
            dtype=torch.int64,
        )

    def _windows(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets (``int64 [len(starts), seq_len]``) of the windows at ``starts``."""
        windows = self._tokens[starts[:, None] + self._offsets].long()
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def micro_batch(self, step: int, index: int) -> MicroBatch:
        """Micro-batch ``index`` of ``step``'s global batch (pure: does not change the sampler)."""
        cfg = self._config
        first = (step - 1) * self.global_batch + index * cfg.micro_batch
        inputs, targets = self._windows(self.sample_starts(first, cfg.micro_batch))
        return MicroBatch(
            index=index,
            inputs=inputs,
            targets=targets,
            dropout_seed=derive_seed("dropout", cfg.seed, step, index),
        )

    def held_out(self, count: int) -> list[MicroBatch]:
        """This data-parallel rank's ``count`` micro-batches of the evaluation set (pure: the
        sampler does not change; module docstring): micro-batches ``dp_rank * count ...
        dp_rank * count + count - 1`` of the ``eval`` stream. Their ``dropout_seed`` is
        never used (evaluation runs with dropout off)."""
        cfg = self._config
        batches = []
        for index in range(self._dp_rank * count, (self._dp_rank + 1) * count):
            starts = self.sample_starts(index * cfg.micro_batch, cfg.micro_batch, stream="eval")
            inputs, targets = self._windows(starts)
            batches.append(
                MicroBatch(
                    index=index,
                    inputs=inputs,
                    targets=targets,
                    dropout_seed=derive_seed("eval-dropout", cfg.seed, index),
                )
            )
        return batches

    def micro_batches_for_step(self, step: int) -> list[MicroBatch]:
        """This rank's :attr:`accumulation_steps` micro-batches of ``step`` (pure)."""
        first = self._dp_rank * self.accumulation_steps
        return [self.micro_batch(step, k) for k in range(first, first + self.accumulation_steps)]

    def next_micro_batches(self) -> tuple[int, list[MicroBatch]]:
        """``(step, micro-batches)`` for :attr:`next_step`, then advance by one."""
        step = self.next_step
        batches = self.micro_batches_for_step(step)
        self.next_step += 1
        return step, batches

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state, identical on every rank and at every ``dp``: the next step
        plus what must match on resume."""
        cfg = self._config
        return {
            "next_step": self.next_step,
            "seed": cfg.seed,
            "seq_len": cfg.seq_len,
            "micro_batch": cfg.micro_batch,
            "global_batch": self.global_batch,
            "corpus_sha256": self._corpus_sha256,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :attr:`next_step` after checking that the data is the same.

        ``micro_batch`` and ``global_batch`` may differ (logged by the
        checkpointer); seed, sequence length and corpus may not.

        Raises:
            CheckpointError: the saved sampler used another seed, sequence length or corpus.
        """
        mine = self.state_dict()
        for key in ("seed", "seq_len", "corpus_sha256"):
            if state.get(key) != mine[key]:
                raise CheckpointError(
                    f"checkpoint's data sampler has {key}={state.get(key)!r}, this run has "
                    f"{mine[key]!r}; resume with the same settings or use a new --checkpoint-dir"
                )
        self.next_step = int(state["next_step"])


__all__ = ["BatchSampler", "MicroBatch", "derive_seed"]
