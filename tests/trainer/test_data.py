"""The batch of step s is a pure function of (seed, s, dp_rank); the sampler's state round-trips."""

from __future__ import annotations

import pytest
import torch

from stormwatch.trainer import CheckpointError, load_stdlib_corpus
from stormwatch.trainer.config import DataConfig
from stormwatch.trainer.data import BatchSampler, derive_seed


@pytest.fixture(scope="module")
def corpus():
    return load_stdlib_corpus(100_000)


def test_batch_depends_only_on_seed_step_and_dp_rank(corpus):
    config = DataConfig(seed=7, seq_len=16, micro_batch=3)
    a = BatchSampler(corpus, config=config, dp_rank=0)
    b = BatchSampler(corpus, config=config, dp_rank=0)
    for _ in range(4):
        a.next_batch()  # advancing one sampler must not change what a step yields
    for step in (1, 5, 17):
        xa, ya = a.batch_for_step(step)
        xb, yb = b.batch_for_step(step)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    other_rank = BatchSampler(corpus, config=config, dp_rank=1).batch_for_step(1)[0]
    other_seed = BatchSampler(
        corpus, config=DataConfig(seed=8, seq_len=16, micro_batch=3), dp_rank=0
    )
    assert not torch.equal(other_rank, a.batch_for_step(1)[0])
    assert not torch.equal(other_seed.batch_for_step(1)[0], a.batch_for_step(1)[0])


def test_batch_ignores_the_global_rng(corpus):
    sampler = BatchSampler(corpus, config=DataConfig(seq_len=8, micro_batch=2), dp_rank=0)
    torch.manual_seed(1)
    first = sampler.batch_for_step(3)[0]
    torch.manual_seed(2)
    torch.rand(10)
    assert torch.equal(first, sampler.batch_for_step(3)[0])


def test_targets_are_inputs_shifted_by_one_byte(corpus):
    sampler = BatchSampler(corpus, config=DataConfig(seq_len=32, micro_batch=4), dp_rank=0)
    inputs, targets = sampler.batch_for_step(1)
    assert inputs.shape == targets.shape == (4, 32)
    assert inputs.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert int(inputs.max()) < 256


def test_sampler_state_round_trips_and_rejects_other_settings(corpus):
    config = DataConfig(seed=3, seq_len=16, micro_batch=2)
    sampler = BatchSampler(corpus, config=config, dp_rank=1)
    for _ in range(5):
        sampler.next_batch()
    state = sampler.state_dict()
    assert state["next_step"] == 6
    fresh = BatchSampler(corpus, config=config, dp_rank=1)
    fresh.load_state_dict(state)
    assert fresh.next_step == 6
    assert torch.equal(fresh.next_batch()[1], sampler.next_batch()[1])
    other = BatchSampler(corpus, config=DataConfig(seed=4, seq_len=16, micro_batch=2), dp_rank=1)
    with pytest.raises(CheckpointError, match="seed"):
        other.load_state_dict(state)


def test_derived_seeds_are_stable_63_bit_values():
    assert derive_seed("batch", 0, 1, 0) == derive_seed("batch", 0, 1, 0)
    assert derive_seed("batch", 0, 1, 0) != derive_seed("batch", 0, 1, 1)
    assert 0 <= derive_seed("x") < 2**63
