"""Per-step measurements: the global gradient norm of a parallelized model, memory, FLOPs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from stormwatch.trainer import ParallelDims, parallelize
from stormwatch.trainer.config import VOCAB_SIZE, ModelConfig
from stormwatch.trainer.instrument import (
    global_grad_norm,
    memory_bytes,
    model_flops_per_token,
)
from stormwatch.trainer.model import ByteLM


def test_grad_norm_of_the_sharded_model_equals_the_plain_norm(one_rank_group):
    config = ModelConfig(d_model=16, n_heads=2, n_layers=1, max_seq_len=8, dropout=0.0)
    torch.manual_seed(0)
    plain = ByteLM(config)
    torch.manual_seed(0)
    dims = ParallelDims(world_size=1)
    dims.build_mesh("cpu")
    sharded = parallelize(
        ByteLM(config), dims, device=torch.device("cpu"), batch_shape=(2, 8)
    ).model
    tokens = torch.randint(0, VOCAB_SIZE, (2, 8))
    for model in (plain, sharded):
        loss = F.cross_entropy(model(tokens).reshape(-1, VOCAB_SIZE), tokens.reshape(-1))
        loss.backward()
    expected = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in plain.parameters()))
    got, votes = global_grad_norm(
        sharded.parameters(), world_size=1, device=torch.device("cpu"), votes=(True, False)
    )
    assert votes == [1, 0]
    assert got == pytest.approx(expected, rel=1e-6)


def test_flops_per_token_counts_non_embedding_parameters():
    config = ModelConfig(d_model=16, n_heads=2, n_layers=1, max_seq_len=8)
    model = ByteLM(config)
    embedding = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    n = sum(p.numel() for p in model.parameters()) - embedding
    assert model_flops_per_token(model, seq_len=8) == 6 * n + 12 * 1 * 16 * 8


def test_memory_on_cpu_is_the_resident_set():
    assert memory_bytes("cpu")["rss"] > 10 * 2**20
