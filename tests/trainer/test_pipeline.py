"""Splitting the model into pipeline stages: balanced blocks, unsplit names, same function."""

from __future__ import annotations

import copy

import pytest
import torch

from stormwatch.trainer.config import ModelConfig
from stormwatch.trainer.model import ByteLM
from stormwatch.trainer.parallel.pipeline import split_stage, stage_layers


@pytest.mark.parametrize(
    ("n_layers", "stages", "expected"),
    [
        (2, 2, [[0], [1]]),
        (4, 2, [[0, 1], [2, 3]]),
        (5, 2, [[0, 1, 2], [3, 4]]),  # earlier stages take the remainder
        (7, 3, [[0, 1, 2], [3, 4], [5, 6]]),
        (3, 1, [[0, 1, 2]]),
    ],
)
def test_stages_hold_contiguous_balanced_blocks(n_layers, stages, expected):
    assert [list(stage_layers(n_layers, s, stages)) for s in range(stages)] == expected


@pytest.mark.parametrize(("n_layers", "stage", "stages"), [(2, 0, 3), (4, 2, 2), (4, -1, 2)])
def test_a_stage_without_blocks_is_rejected(n_layers, stage, stages):
    with pytest.raises(ValueError, match=f"stage {stage} of {stages}"):
        stage_layers(n_layers, stage, stages)


def test_stages_keep_the_unsplit_parameter_names_and_chain_to_the_same_logits():
    torch.manual_seed(0)
    model = ByteLM(ModelConfig(n_layers=3, dropout=0.0))
    whole = dict(model.named_parameters())
    first = split_stage(copy.deepcopy(model), 0, 2)
    last = split_stage(copy.deepcopy(model), 1, 2)

    first_names = {name for name, _ in first.named_parameters()}
    last_names = {name for name, _ in last.named_parameters()}
    assert first_names.isdisjoint(last_names)
    assert first_names | last_names == set(whole)
    assert {"tok_emb.weight", "pos_emb.weight", "layers.1.attn.wq.weight"} <= first_names
    assert {"layers.2.attn.wq.weight", "norm.weight", "head.weight"} <= last_names

    tokens = torch.randint(0, 256, (2, 16))
    hidden = first(tokens)
    assert hidden.shape == (2, 16, 64)  # activations sent between stages: [B, T, d_model]
    torch.testing.assert_close(last(hidden), model(tokens), rtol=0, atol=0)
