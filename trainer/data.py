"""Deterministic batches: the batch for step ``s`` is a pure function of ``(seed, s, dp_rank)``.

Each step draws ``micro_batch`` random windows of ``seq_len + 1`` bytes from
the corpus with a fresh :class:`torch.Generator` seeded by
:func:`derive_seed` ``("batch", seed, step, dp_rank)``. Nothing carries over
from one step to the next, so resuming at step ``s`` only needs ``s`` (the
sampler's saved state also pins the seed, shape and corpus fingerprint, so a
checkpoint is never resumed on different data). Ranks of one tensor-parallel
group share a data-parallel rank and therefore see the same batch.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from stormwatch.trainer.config import DataConfig
from stormwatch.trainer.corpus import Corpus
from stormwatch.trainer.errors import CheckpointError, CorpusError


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from a tuple of values (SHA-256 of their ``repr``), stable across runs.

    Unlike :func:`hash`, the result does not depend on ``PYTHONHASHSEED``.
    """
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class BatchSampler:
    """Draws one ``(inputs, targets)`` batch per training step.

    Args:
        corpus: the byte corpus; must be longer than ``config.seq_len + 1``.
        config: seed and shapes.
        dp_rank: this rank's data-parallel index (``0 <= dp_rank``).

    Raises:
        CorpusError: the corpus is too short for one window.
    """

    def __init__(self, corpus: Corpus, *, config: DataConfig, dp_rank: int) -> None:
        if len(corpus) < config.seq_len + 2:
            raise CorpusError(
                f"corpus has {len(corpus)} bytes; need at least seq_len + 2 = {config.seq_len + 2}"
            )
        self._config = config
        self._dp_rank = dp_rank
        self._corpus_sha256 = corpus.sha256
        # bytearray: frombuffer needs a writable buffer to avoid a warning.
        self._tokens = torch.frombuffer(bytearray(corpus.data), dtype=torch.uint8)
        self._offsets = torch.arange(config.seq_len + 1)
        self.next_step = 1

    def batch_for_step(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of ``step`` (pure: does not change the sampler).

        Returns:
            ``(inputs, targets)``, both ``int64`` of shape ``[micro_batch, seq_len]``
            with byte values 0..255; ``targets`` is ``inputs`` shifted by one byte.
        """
        cfg = self._config
        gen = torch.Generator().manual_seed(derive_seed("batch", cfg.seed, step, self._dp_rank))
        high = self._tokens.numel() - cfg.seq_len - 1
        starts = torch.randint(0, high, (cfg.micro_batch,), generator=gen)
        windows = self._tokens[starts[:, None] + self._offsets].long()
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def next_batch(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        """``(step, inputs, targets)`` for :attr:`next_step`, then advance by one."""
        step = self.next_step
        inputs, targets = self.batch_for_step(step)
        self.next_step += 1
        return step, inputs, targets

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state: the next step plus what must match on resume."""
        cfg = self._config
        return {
            "next_step": self.next_step,
            "seed": cfg.seed,
            "dp_rank": self._dp_rank,
            "seq_len": cfg.seq_len,
            "micro_batch": cfg.micro_batch,
            "corpus_sha256": self._corpus_sha256,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :attr:`next_step` after checking seed, shapes and corpus match.

        Raises:
            CheckpointError: the saved sampler used another seed, shape, rank or corpus.
        """
        mine = self.state_dict()
        for key in ("seed", "dp_rank", "seq_len", "micro_batch", "corpus_sha256"):
            if state.get(key) != mine[key]:
                raise CheckpointError(
                    f"checkpoint's data sampler has {key}={state.get(key)!r}, this run has "
                    f"{mine[key]!r}; resume with the same settings or use a new --checkpoint-dir"
                )
        self.next_step = int(state["next_step"])


__all__ = ["BatchSampler", "derive_seed"]
