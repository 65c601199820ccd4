"""Async checkpoints block the training loop only for a hand-over (issue 20).

Real DCP, one process (gloo, world size 1), a small model and Adam: the save plan is
computed once and the staging buffers are reused from save to save; the write, the
checksums, the marker and the rename run on the writer thread, committed before the
training thread asks; the copy of the state runs off the training thread, and the
next optimizer step waits for it, so a save holds its own step's values bit for bit.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint._state_dict_stager import StateDictStager

from stormwatch.trainer.checkpoint import store
from stormwatch.trainer.checkpoint.checkpointer import Checkpointer
from stormwatch.trainer.checkpoint.state import RankLayout, TrainState
from stormwatch.trainer.config import CheckpointConfig, DataConfig
from stormwatch.trainer.data.batches import BatchSampler
from stormwatch.trainer.data.corpus import load_stdlib_corpus
from stormwatch.trainer.errors import CheckpointError

LAYOUT = RankLayout(rank=0, world_size=1, dp=1, tp=1, dp_rank=0, attempt=0)


def _sampler() -> BatchSampler:
    """The trainer's sampler over a small corpus: a global batch of 4 (micro-batch 4)."""
    return BatchSampler(load_stdlib_corpus(4096), config=DataConfig(), dp=1, dp_rank=0)


def _state(seed: int) -> TrainState:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return TrainState(
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
        sampler=_sampler(),
        seed=seed,
    )


def _checkpointer(root: Path, state: TrainState, **kwargs: Any) -> Checkpointer:
    config = CheckpointConfig(directory=root, every=1, keep=5, mode="async")
    return Checkpointer(config, state=state, layout=LAYOUT, **kwargs)


def _step(state: TrainState, checkpointer: Checkpointer) -> None:
    """Forward, backward, then (as the loop does) wait for the copy before the update."""
    loss = state.model(torch.randn(8, 16)).square().mean()
    loss.backward()
    checkpointer.wait_for_copy()
    state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.sampler.next_step += 1


def _snapshot(state: TrainState) -> dict[str, torch.Tensor]:
    values = {f"p.{k}": v.detach().clone() for k, v in state.model.state_dict().items()}
    for i, param in enumerate(state.model.parameters()):
        for key, value in state.optimizer.state[param].items():
            values[f"o.{i}.{key}"] = value.detach().clone()
    return values


def _resumed(root: Path) -> tuple[int | None, dict[str, torch.Tensor]]:
    fresh = _state(seed=99)  # other values everywhere: the load must overwrite them all
    _step(fresh, _checkpointer(root / "unused", fresh))  # Adam's state exists, as in a run
    checkpointer = _checkpointer(root, fresh)
    return checkpointer.load_latest(), _snapshot(fresh)


def _assert_bitwise(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key


@pytest.mark.usefixtures("one_rank_group")
def test_the_save_plan_is_made_once_and_the_staging_buffers_are_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[dict[str, Any]] = []
    global_plans: list[int] = []
    real_save, real_plan = dcp.save, DefaultSavePlanner._create_global_plan

    def save(state: dict[str, Any], **kwargs: Any) -> Any:
        written.append(state)
        return real_save(state, **kwargs)

    def plan(self: DefaultSavePlanner, all_plans: Any) -> Any:
        global_plans.append(len(all_plans))
        return real_plan(self, all_plans)

    monkeypatch.setattr(dcp, "save", save)
    monkeypatch.setattr(DefaultSavePlanner, "_create_global_plan", plan)
    state = _state(seed=0)
    checkpointer = _checkpointer(tmp_path, state)
    for step in (1, 2, 3):
        _step(state, checkpointer)
        checkpointer.save(step)
    assert checkpointer.finish() == 3
    checkpointer.close()

    assert len(written) == 3
    assert global_plans == [1]  # the second and third saves reuse the plan
    buffers = [[t.data_ptr() for t in s["model"].values()] for s in written]
    assert buffers[0] == buffers[1] == buffers[2]  # copied into the same CPU buffers
    live = [p.data_ptr() for p in state.model.parameters()]
    assert not set(buffers[0]) & set(live)  # ... which are copies, not the parameters
    assert [c.step for c in store.scan(tmp_path).complete] == [1, 2, 3]


@pytest.mark.usefixtures("one_rank_group")
def test_write_and_commit_run_on_the_writer_thread_while_training_goes_on(
    tmp_path: Path,
) -> None:
    release = threading.Event()
    threads: dict[str, str] = {}

    def hook(phase: str, step: int) -> None:
        threads[phase] = threading.current_thread().name
        if phase == "before_shards":
            assert release.wait(30)

    state = _state(seed=0)
    checkpointer = _checkpointer(tmp_path, state, fault_hook=hook)
    _step(state, checkpointer)
    started = time.monotonic()
    assert checkpointer.save(1) is False  # handed over: returns while the write is held
    assert time.monotonic() - started < 5
    _step(state, checkpointer)  # the next step trains while the write is held
    assert not checkpointer.write_finished()
    assert store.scan(tmp_path).complete == ()
    release.set()
    deadline = time.monotonic() + 30
    while not checkpointer.write_finished() and time.monotonic() < deadline:
        time.sleep(0.01)
    # committed by the writer thread (marker, checksums, rename) before finish() is called
    assert [c.step for c in store.scan(tmp_path).complete] == [1]
    assert store.sound(tmp_path / store.step_dir_name(1))
    assert set(threads) == {"before_shards", "before_metadata", "before_marker"}
    assert threading.main_thread().name not in threads.values()
    assert checkpointer.finish() == 1
    checkpointer.close()


@pytest.mark.usefixtures("one_rank_group")
def test_a_save_overlapping_the_next_optimizer_step_holds_its_own_step_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_stage = StateDictStager.stage

    def slow_stage(self: StateDictStager, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)  # the copy is still running when the next step reaches its update
        return real_stage(self, *args, **kwargs)

    monkeypatch.setattr(StateDictStager, "stage", slow_stage)
    state = _state(seed=0)
    checkpointer = _checkpointer(tmp_path, state)
    expected: dict[int, dict[str, torch.Tensor]] = {}
    for step in (1, 2):
        _step(state, checkpointer)
        expected[step] = _snapshot(state)
        started = time.monotonic()
        checkpointer.save(step)
        assert time.monotonic() - started < 0.4  # the copy is not on the training thread
        assert checkpointer.copy_pending()
        started = time.monotonic()
        _step(state, checkpointer)  # waits for the copy before the optimizer step
        assert time.monotonic() - started > 0.1
        assert not checkpointer.copy_pending()
    assert checkpointer.finish() == 2
    checkpointer.close()

    resumed, values = _resumed(tmp_path)  # step 2: written with the cached plan
    assert resumed == 2
    _assert_bitwise(values, expected[2])
    assert not torch.equal(expected[1]["p.0.weight"], expected[2]["p.0.weight"])


@pytest.mark.usefixtures("one_rank_group")
def test_a_failed_background_write_raises_at_finish_and_leaves_nothing_complete(
    tmp_path: Path,
) -> None:
    def hook(phase: str, step: int) -> None:
        if (phase, step) == ("before_marker", 2):
            raise OSError(28, "No space left on device")

    state = _state(seed=0)
    checkpointer = _checkpointer(tmp_path, state, fault_hook=hook)
    _step(state, checkpointer)
    checkpointer.save(1)
    _step(state, checkpointer)
    checkpointer.save(2)  # records the commit of step 1
    with pytest.raises(CheckpointError, match=r"rank 0: OSError: \[Errno 28\] No space left"):
        checkpointer.finish()
    found = store.scan(tmp_path)
    assert [c.step for c in found.complete] == [1]  # step 2 never looks complete
    _step(state, checkpointer)
    checkpointer.save(3)  # the next save works
    assert checkpointer.finish() == 3
    checkpointer.close()
    assert [c.step for c in store.scan(tmp_path).complete] == [1, 3]
