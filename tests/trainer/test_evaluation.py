"""Evaluation passes (``--eval-every``): held-out batches of their own, a pass inside the phase
``eval`` that leaves the training state (sampler, random generators, weights, mode) alone,
and the options' checks. The bitwise resume with evaluation on is tests/trainer/test_e2e_eval.py."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from stormwatch.errors import ConfigError
from stormwatch.trainer import ParallelDims, load_stdlib_corpus, parallelize
from stormwatch.trainer.config import VOCAB_SIZE, DataConfig, EvalConfig, ModelConfig, TrainConfig
from stormwatch.trainer.data.batches import BatchSampler
from stormwatch.trainer.evaluation import Evaluator
from stormwatch.trainer.model import ByteLM

SHAPE = {"seed": 3, "seq_len": 8, "micro_batch": 2}


@pytest.fixture(scope="module")
def corpus():
    return load_stdlib_corpus(50_000)


def _sampler(corpus, *, dp: int = 1, dp_rank: int = 0) -> BatchSampler:
    return BatchSampler(corpus, config=DataConfig(**SHAPE), dp=dp, dp_rank=dp_rank)


def _full(param: torch.Tensor) -> torch.Tensor:
    return (param.full_tensor() if isinstance(param, DTensor) else param).detach().clone()


class RecordingSession:
    """The two methods of a telemetry session an evaluator uses; records the phases entered."""

    def __init__(self) -> None:
        self.phases: list[str] = []
        self.inside: list[str] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.phases.append(name)
        self.inside.append(name)
        try:
            yield
        finally:
            self.inside.pop()

    def span(self, name: str, **attributes: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def test_held_out_batches_are_their_own_stream_and_leave_the_sampler_alone(corpus) -> None:
    sampler = _sampler(corpus)
    sampler.next_micro_batches()
    first = sampler.held_out(3)
    again = _sampler(corpus).held_out(3)
    assert sampler.next_step == 2  # reading the evaluation set does not advance training
    assert [b.index for b in first] == [0, 1, 2]
    assert all(torch.equal(a.inputs, b.inputs) for a, b in zip(first, again, strict=True))
    training = [sampler.micro_batch(step, 0).inputs for step in range(1, 4)]
    assert not any(torch.equal(b.inputs, t) for b in first for t in training)
    assert all(torch.equal(b.targets[:, :-1], b.inputs[:, 1:]) for b in first)
    # Each data-parallel rank evaluates its own share: rank 1 of 2 takes the next batches.
    second_rank = _sampler(corpus, dp=2, dp_rank=1).held_out(2)
    assert [b.index for b in second_rank] == [2, 3]
    assert torch.equal(second_rank[0].inputs, _sampler(corpus).held_out(3)[2].inputs)


@pytest.mark.parametrize(
    ("every", "step", "due"),
    [(0, 10, False), (5, 4, False), (5, 5, True), (5, 10, True), (1, 1, True), (3, 7, False)],
)
def test_a_pass_is_due_after_every_nth_step(corpus, every: int, step: int, due: bool) -> None:
    evaluator = Evaluator(
        EvalConfig(every=every),
        ParallelDims(world_size=1),
        model=torch.nn.Identity(),
        sampler=_sampler(corpus),
        device=torch.device("cpu"),
        session=RecordingSession(),  # type: ignore[arg-type]
    )
    assert evaluator.due(step) is due


def test_a_pass_runs_inside_the_eval_phase_and_leaves_training_state_alone(
    one_rank_group, corpus
) -> None:
    config = ModelConfig(d_model=16, n_heads=2, n_layers=1, max_seq_len=8, dropout=0.5)
    torch.manual_seed(0)
    dims = ParallelDims(world_size=1)
    dims.build_mesh("cpu")
    model = parallelize(ByteLM(config), dims, device=torch.device("cpu"), batch_shape=(2, 8)).model
    sampler = _sampler(corpus)
    session = RecordingSession()
    evaluator = Evaluator(
        EvalConfig(every=2, batches=3),
        dims,
        model=model,
        sampler=sampler,
        device=torch.device("cpu"),
        session=session,  # type: ignore[arg-type]
    )
    torch.manual_seed(1234)
    rng = torch.get_rng_state()
    weights = [_full(p) for p in model.parameters()]

    result = evaluator.run(4)

    assert session.phases == ["eval"] and session.inside == []
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(_full(p), w) for p, w in zip(model.parameters(), weights, strict=True))
    assert sampler.next_step == 1
    assert (result.step, result.batches) == (4, 3) and result.seconds >= 0
    # The loss is the plain mean cross-entropy of the held-out batches, dropout off.
    model.eval()
    with torch.no_grad():
        expected = sum(
            float(F.cross_entropy(model(b.inputs).reshape(-1, VOCAB_SIZE), b.targets.reshape(-1)))
            for b in sampler.held_out(3)
        )
    model.train()
    assert result.loss == pytest.approx(expected / 3, rel=1e-6)
    assert math.isfinite(result.loss)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: EvalConfig(every=-1), "eval_every"),
        (lambda: EvalConfig(every=True), "eval_every"),
        (lambda: EvalConfig(batches=0), "eval_batches"),
        (lambda: EvalConfig(delay=-0.5), "eval_delay"),
        (lambda: EvalConfig(delay=float("inf")), "eval_delay"),
        (lambda: TrainConfig(steps=4, pp=2, evaluation=EvalConfig(every=2)), "eval_every"),
    ],
)
def test_bad_evaluation_settings_name_the_option(make, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        make()
