"""A small decoder-only byte-level transformer language model (pre-norm, GPT-2 style).

Shapes: tokens ``[batch, seq]`` (int64 byte values) -> logits ``[batch, seq, 256]``.

Tensor-parallel friendly: the attention and MLP projections are separate
``nn.Linear`` modules (``wq``/``wk``/``wv``/``wo``, ``w1``/``w2``) so that
:func:`stormwatch.trainer.parallel.apply.parallelize` can shard them column- and
row-wise; the attention reads its local head count from the projected shape,
so the same code runs unsharded and with ``n_heads / tp`` heads per rank.

Pipeline parallelism (:mod:`stormwatch.trainer.parallel.pipeline`) keeps one
:class:`ByteLM` per stage with the modules of other stages set to ``None``:
the first stage keeps the embeddings, the last the final norm and head, and
each stage its slice of ``layers`` under the *original* keys, so parameter
names (and checkpoint keys) are the same whatever the number of stages.
:meth:`ByteLM.forward` then maps tokens or hidden states to hidden states or
logits, depending on which ends it holds.

Dropout sits only where activations are replicated across a tensor-parallel
group (after the embeddings and after each block's output projections).
Ranks of one TP group share a CPU RNG stream (same seed, same sequence of
random ops), so they draw identical masks and the replicas stay identical.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stormwatch.trainer.config import VOCAB_SIZE, ModelConfig


class Attention(nn.Module):
    """Causal multi-head self-attention; ``[B, T, d_model] -> [B, T, d_model]``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.head_dim = config.head_dim
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        # -1: n_heads unsharded, n_heads / tp under tensor parallelism.
        q = self.wq(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(bsz, seq, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(1, 2).reshape(bsz, seq, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    """GELU MLP; ``[B, T, d_model] -> [B, T, d_model]``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.ffn_dim)
        self.w2 = nn.Linear(config.ffn_dim, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + drop(attn(ln(x)))``, then ``x + drop(mlp(ln(x)))``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(config.d_model)
        self.attn = Attention(config)
        self.mlp_norm = nn.LayerNorm(config.d_model)
        self.mlp = FeedForward(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.attn_norm(x)))
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class ByteLM(nn.Module):
    """Decoder-only byte-level LM (vocabulary 256, learned positions, untied head).

    Args:
        config: model shape; build under a fixed ``torch.manual_seed`` so that
            every rank starts from the same weights before sharding.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # Optional: a pipeline stage other than the first / last drops them.
        self.tok_emb: nn.Embedding | None = nn.Embedding(VOCAB_SIZE, config.d_model)
        self.pos_emb: nn.Embedding | None = nn.Embedding(config.max_seq_len, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        # ModuleDict keyed "0", "1", ... keeps FQNs stable for checkpoints (and
        # across pipeline stages, which keep the keys of their layers).
        self.layers = nn.ModuleDict({str(i): Block(config) for i in range(config.n_layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(config.d_model)
        self.head: nn.Linear | None = nn.Linear(config.d_model, VOCAB_SIZE, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, 256]`` for byte tokens ``[B, T]`` (``T <= max_seq_len``).

        A pipeline stage without the embeddings takes hidden states
        ``[B, T, d_model]`` instead of tokens; one without the head returns
        hidden states ``[B, T, d_model]`` instead of logits.
        """
        if self.tok_emb is not None and self.pos_emb is not None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.dropout(self.tok_emb(tokens) + self.pos_emb(positions))
        else:
            x = tokens
        for block in self.layers.values():
            x = block(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.head is not None:
            x = self.head(x)
        return x


__all__ = ["Attention", "Block", "ByteLM", "FeedForward"]
