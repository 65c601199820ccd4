"""Resume never starts over beside damaged checkpoints, never deletes what it did not write,
and refuses settings that do not fit the checkpoint (real DCP, one process, sync saves)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from stormwatch.trainer.checkpoint import store
from stormwatch.trainer.checkpoint.checkpointer import Checkpointer
from stormwatch.trainer.checkpoint.settings import check_resume, run_settings
from stormwatch.trainer.checkpoint.state import RankLayout, TrainState
from stormwatch.trainer.config import CheckpointConfig, DataConfig, ModelConfig, TrainConfig
from stormwatch.trainer.data.batches import BatchSampler
from stormwatch.trainer.data.corpus import load_stdlib_corpus
from stormwatch.trainer.errors import ResumeRefused

LAYOUT = RankLayout(rank=0, world_size=1, dp=1, tp=1, dp_rank=0, attempt=0)


def _sampler() -> BatchSampler:
    """The trainer's sampler over a small corpus: a global batch of 4 (micro-batch 4)."""
    return BatchSampler(load_stdlib_corpus(4096), config=DataConfig(), dp=1, dp_rank=0)


#: Every test here runs in a one-rank gloo group (conftest).
pytestmark = pytest.mark.usefixtures("one_rank_group")


def _settings(**model: Any) -> dict[str, int | float | str]:
    config = TrainConfig(steps=10, model=ModelConfig(**model), data=DataConfig())
    return run_settings(config, global_batch=4)


def _checkpointer(root: Path, *, keep: int = 5, **settings: Any) -> Checkpointer:
    model = nn.Linear(4, 4)
    state = TrainState(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        sampler=_sampler(),
        seed=0,
    )
    config = CheckpointConfig(directory=root, every=2, keep=keep)
    return Checkpointer(config, state=state, layout=LAYOUT, settings=_settings(**settings))


def _saved(root: Path, *steps: int, keep: int = 5) -> None:
    checkpointer = _checkpointer(root, keep=keep)
    for step in steps:
        assert checkpointer.save(step)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_fc11_a_folder_of_only_damaged_checkpoints_is_refused_and_left_as_it_was(
    tmp_path: Path,
) -> None:
    _saved(tmp_path, 4, 6, 8)
    _flip(tmp_path / "step-00000004" / store.METADATA_NAME)
    (tmp_path / "step-00000006" / store.MARKER_NAME).unlink()
    (tmp_path / "step-00000008" / store.MARKER_NAME).write_text("garbage")
    before = _tree(tmp_path)
    with pytest.raises(ResumeRefused) as info:
        _checkpointer(tmp_path).load_latest()
    message = str(info.value)
    assert info.value.exit_code == 2
    for name in ("step-00000004: checksum mismatch", "step-00000006: no", "step-00000008: unread"):
        assert name in message
    assert "new --checkpoint-dir" in message and "move the damaged folders" in message
    assert _tree(tmp_path) == before


def test_leftovers_of_saves_that_never_committed_still_start_fresh(tmp_path: Path) -> None:
    crashed = tmp_path / store.tmp_dir_name(2, attempt=0, token="deadbeef")
    crashed.mkdir(parents=True)
    (crashed / "__0_0.distcp").write_bytes(b"shard")
    checkpointer = _checkpointer(tmp_path)
    assert checkpointer.load_latest() is None
    assert checkpointer.save(2)
    assert not crashed.exists()  # the save's own leftover is pruned, as before


def test_fc11_damaged_checkpoints_beside_a_usable_one_are_set_aside_and_never_pruned(
    tmp_path: Path,
) -> None:
    _saved(tmp_path, 2, 4, 6)
    _flip(tmp_path / "step-00000004" / store.METADATA_NAME)
    (tmp_path / "step-00000006" / store.MARKER_NAME).unlink()
    checkpointer = _checkpointer(tmp_path, keep=1)
    assert checkpointer.load_latest() == 2
    aside = sorted(p.name for p in tmp_path.iterdir() if store.DAMAGED_INFIX in p.name)
    assert [name[:13] for name in aside] == ["step-00000004", "step-00000006"]
    for step in (4, 6, 8):
        assert checkpointer.save(step)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [*aside, "step-00000008"]  # keep=1 pruned 2, 4, 6: not the damaged ones


def test_a_save_sets_aside_a_folder_it_did_not_create(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpointer = _checkpointer(tmp_path)
    assert checkpointer.save(2)
    copy = tmp_path / "step-00000020"
    shutil.copytree(tmp_path / "step-00000002", copy)  # valid, but of step 2
    copied = _tree(copy)
    with caplog.at_level(logging.WARNING):
        assert checkpointer.save(20)
    assert store.sound(copy) and store.read_marker(copy).step == 20
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("step-00000020.damaged-")]
    assert _tree(aside) == copied
    assert f"set damaged checkpoint {copy} aside as {aside.name}" in caplog.text


def test_a_stray_file_named_like_a_checkpoint_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "step-00000099").write_text("not a checkpoint")
    checkpointer = _checkpointer(tmp_path, keep=1)
    with caplog.at_level(logging.WARNING):
        assert checkpointer.load_latest() is None
        assert checkpointer.save(2) and checkpointer.save(4)
    assert caplog.text == ""
    assert (tmp_path / "step-00000099").read_text() == "not a checkpoint"


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"n_heads": 2}, "--n-heads 4 where this run has 2 (the attention layout)"),
        ({"d_model": 32}, "--d-model 64 where this run has 32"),
        ({"n_layers": 1}, "--n-layers 2 where this run has 1"),
    ],
)
def test_resuming_with_another_model_shape_is_refused_naming_the_option(
    tmp_path: Path, changed: dict[str, int], named: str
) -> None:
    _saved(tmp_path, 2)
    with pytest.raises(ResumeRefused) as info:
        _checkpointer(tmp_path, **changed).load_latest()
    assert named in str(info.value)
    assert "or use a new --checkpoint-dir" in str(info.value)
    assert store.sound(tmp_path / "step-00000002")


def test_resuming_with_another_dropout_warns_and_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _saved(tmp_path, 2)
    with caplog.at_level(logging.WARNING):
        assert _checkpointer(tmp_path, dropout=0.2).load_latest() == 2
    assert "was written with --dropout 0.1, this run uses 0.2 (allowed" in caplog.text


def test_another_global_batch_is_refused_unless_the_job_was_resized() -> None:
    saved = _settings()
    mine = {**saved, "--micro-batch": 2, "--global-batch": 8}
    with pytest.raises(ResumeRefused, match="resume with --global-batch 4,"):
        check_resume(saved, mine, origin=Path("ck/step-00000002"), same_layout=True)
    warnings = check_resume(saved, mine, origin=Path("ck/step-00000002"), same_layout=False)
    assert [w.split(" was written with ")[1][:14] for w in warnings] == ["--micro-batch "]
    assert check_resume({}, mine, origin=Path("old"), same_layout=True) == []  # older markers
