"""End to end under real torchrun (2 CPU ranks, FSDP2 dp=2, gloo): evaluation passes
(``--eval-every``) change no training loss, and a run killed after evaluating resumes to
losses bitwise identical to a run that never evaluated (the passes read their own batches
and leave the sampler and the random generators as they were)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.untimed]

NPROC = 2
STEPS = 8
TRAIN_ARGS = ["--dp", "2", "--steps", str(STEPS), "--checkpoint-every", "3", "--job", "e2e-eval"]
EVAL_ARGS = ["--eval-every", "2", "--eval-batches", "2", "--eval-delay", "0.05"]
#: Rank 1 is SIGKILLed in step 7 of the first attempt: evaluations after steps 2, 4 and 6 ran,
#: the resume is from the step-6 checkpoint, and the evaluation after step 8 runs once more.
KILL = {1: [{"point": "kill_at_step", "step": 7, "attempt": 0}]}


@pytest.fixture(scope="module")
def without_eval(tmp_path_factory, torchrun_train) -> Any:
    run = torchrun_train(tmp_path_factory.mktemp("no-eval"), TRAIN_ARGS, nproc=NPROC)
    assert run.returncode == 0, run.output[-5000:]
    return run


@pytest.fixture(scope="module")
def evaluated_killed_resumed(tmp_path_factory, torchrun_train) -> Any:
    run = torchrun_train(
        tmp_path_factory.mktemp("eval"),
        [*TRAIN_ARGS, *EVAL_ARGS],
        nproc=NPROC,
        control=KILL,
        max_restarts=1,
    )
    assert run.returncode == 0, run.output[-5000:]
    return run


def test_evaluating_and_resuming_leaves_every_training_loss_bitwise_unchanged(
    without_eval, evaluated_killed_resumed
) -> None:
    reference = {step: next(iter(hexes)) for step, hexes in without_eval.losses(0).items()}
    assert sorted(reference) == list(range(1, STEPS + 1))
    for rank in range(NPROC):
        losses = evaluated_killed_resumed.losses(rank)
        assert sorted(losses) == list(range(1, STEPS + 1)), f"rank {rank}"
        for step, hexes in losses.items():
            assert hexes == {reference[step]}, f"rank {rank} step {step}: {hexes}"
        starts = [e for e in evaluated_killed_resumed.events(rank) if e.event == "start"]
        assert [(s.attempt, s.resumed_from_step) for s in starts] == [(0, None), (1, 6)]


def test_each_pass_is_logged_and_marked_as_the_eval_phase(evaluated_killed_resumed) -> None:
    output = evaluated_killed_resumed.output
    for step in (2, 4, 6, 8):
        assert f"eval after step {step}: loss " in output, output[-3000:]
    assert "eval after step 3" not in output
    phases = {
        dict(labels)["phase"]
        for (name, labels) in evaluated_killed_resumed.samples()
        if name == "stormwatch_train_phase_deadline_timestamp_seconds"
    }
    assert "eval" in phases, phases
