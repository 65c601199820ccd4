"""The global batch of step s depends on (seed, s, global batch), never on dp; the state round-trips."""

from __future__ import annotations

import pytest
import torch

from stormwatch.errors import ConfigError
from stormwatch.trainer import CheckpointError, load_stdlib_corpus
from stormwatch.trainer.config import DataConfig
from stormwatch.trainer.data.batches import BatchSampler, derive_seed


@pytest.fixture(scope="module")
def corpus():
    return load_stdlib_corpus(100_000)


def _sampler(corpus, *, dp=1, dp_rank=0, **data):
    return BatchSampler(corpus, config=DataConfig(**data), dp=dp, dp_rank=dp_rank)


def _step_inputs(sampler, step):
    return [mb.inputs for mb in sampler.micro_batches_for_step(step)]


def test_global_batch_of_a_step_is_the_same_whatever_the_dp_degree(corpus):
    shape = {"seed": 7, "seq_len": 16, "micro_batch": 2, "global_batch": 8}
    one = _step_inputs(_sampler(corpus, dp=1, **shape), 3)
    two = [x for r in range(2) for x in _step_inputs(_sampler(corpus, dp=2, dp_rank=r, **shape), 3)]
    four = [
        x for r in range(4) for x in _step_inputs(_sampler(corpus, dp=4, dp_rank=r, **shape), 3)
    ]
    assert len(one) == 4 and len(two) == 4 and len(four) == 4  # micro-batches of 2 sequences
    assert all(
        torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(one, two, four, strict=True)
    )
    seeds = {mb.dropout_seed for mb in _sampler(corpus, dp=1, **shape).micro_batches_for_step(3)}
    assert len(seeds) == 4  # one dropout seed per micro-batch, as independent of dp as the data


def test_accumulation_steps_fill_the_global_batch(corpus):
    sampler = _sampler(corpus, dp=2, dp_rank=1, micro_batch=2, global_batch=12)
    assert sampler.accumulation_steps == 3 and sampler.global_batch == 12
    assert [mb.index for mb in sampler.micro_batches_for_step(1)] == [3, 4, 5]
    default = _sampler(corpus, dp=4, dp_rank=0, micro_batch=2)
    assert default.accumulation_steps == 1 and default.global_batch == 8


def test_global_batch_not_divisible_names_the_flags_and_the_fix(corpus):
    with pytest.raises(
        ConfigError, match=r"global_batch: 10 is not a multiple of micro_batch x dp"
    ):
        _sampler(corpus, dp=2, micro_batch=2, global_batch=10)
    with pytest.raises(ConfigError, match="--global-batch as a multiple of 4"):
        DataConfig(micro_batch=2, global_batch=6).accumulation_steps(2)


def test_steps_use_consecutive_disjoint_sample_ranges(corpus):
    sampler = _sampler(corpus, seq_len=8, micro_batch=3, global_batch=3)
    step2 = sampler.micro_batches_for_step(2)[0].inputs
    starts = sampler.sample_starts(3, 3)  # samples 3, 4, 5 belong to step 2
    assert torch.equal(step2[:, 0], torch.tensor([corpus.data[i] for i in starts.tolist()]))
    assert not torch.equal(sampler.micro_batches_for_step(1)[0].inputs, step2)


def test_batches_depend_on_the_seed_and_ignore_the_global_rng(corpus):
    sampler = _sampler(corpus, seed=1, seq_len=8, micro_batch=2)
    torch.manual_seed(1)
    first = _step_inputs(sampler, 3)[0]
    torch.manual_seed(2)
    torch.rand(10)
    assert torch.equal(first, _step_inputs(sampler, 3)[0])
    assert not torch.equal(
        first, _step_inputs(_sampler(corpus, seed=2, seq_len=8, micro_batch=2), 3)[0]
    )


def test_targets_are_inputs_shifted_by_one_byte(corpus):
    (micro,) = _sampler(corpus, seq_len=32, micro_batch=4).micro_batches_for_step(1)
    assert micro.inputs.shape == micro.targets.shape == (4, 32)
    assert micro.inputs.dtype == torch.int64
    assert torch.equal(micro.inputs[:, 1:], micro.targets[:, :-1])
    assert int(micro.inputs.max()) < 256


def test_sampler_state_is_dp_independent_and_rejects_other_data(corpus):
    shape = {"seed": 3, "seq_len": 16, "micro_batch": 2, "global_batch": 4}
    sampler = _sampler(corpus, dp=2, dp_rank=1, **shape)
    for _ in range(5):
        sampler.next_micro_batches()
    state = sampler.state_dict()
    assert state["next_step"] == 6 and "dp_rank" not in state
    assert state == {**_sampler(corpus, dp=1, **shape).state_dict(), "next_step": 6}
    resized = _sampler(corpus, dp=1, **shape)  # written at dp=2, loaded at dp=1
    resized.load_state_dict(state)
    step, batches = resized.next_micro_batches()
    assert step == 6 and torch.equal(batches[1].inputs, sampler.next_micro_batches()[1][0].inputs)
    other = _sampler(corpus, dp=2, dp_rank=1, **{**shape, "seed": 4})
    with pytest.raises(CheckpointError, match="seed"):
        other.load_state_dict(state)


def test_derived_seeds_are_stable_63_bit_values():
    assert derive_seed("batch", 0, 1, 0) == derive_seed("batch", 0, 1, 0)
    assert derive_seed("batch", 0, 1, 0) != derive_seed("batch", 0, 1, 1)
    assert 0 <= derive_seed("x") < 2**63
