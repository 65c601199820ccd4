"""Progress lines on stderr (rank 0) and the warning when a checkpoint is already past --steps."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from stormwatch.errors import ConfigError
from stormwatch.telemetry.events import read_events
from stormwatch.trainer.config import (
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    TelemetryConfig,
    TrainConfig,
)
from stormwatch.trainer.progress import ConsoleProgress
from stormwatch.trainer.runtime import RankEnv


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_step_lines_every_n_steps_and_at_the_last():
    out = io.StringIO()
    progress = ConsoleProgress(every=10, stream=out)
    for step in range(1, 26):
        progress.step(step=step, last_step=25, loss=2.5, seconds=0.5, tokens=1000)
    assert [line.split()[2] for line in _lines(out)] == ["10/25", "20/25", "25/25"]
    assert _lines(out)[0] == "train: step 10/25  loss 2.5000  500.0 ms/step  2,000 tokens/s"


def test_start_and_done_lines_say_mesh_origin_and_where_outputs_are(tmp_path):
    out = io.StringIO()
    progress = ConsoleProgress(every=1, stream=out)
    progress.start(
        world_size=4,
        mesh=(("pp", 2), ("dp_shard", 2), ("tp", 1)),
        resumed_from_step=20,
        steps=30,
        checkpoint_dir=tmp_path / "ck",
    )
    for step in (21, 22):
        progress.step(step=step, last_step=22, loss=1.0, seconds=0.1, tokens=10)
    progress.done(
        last_step=22, checkpoint_dir=tmp_path / "ck", log_dir=tmp_path / "logs", metrics_dir=None
    )
    start, *_, done = _lines(out)
    assert "world size 4, mesh pp=2 x dp_shard=2 x tp=1, resumed from step 20" in start
    assert f"checkpoints: {tmp_path / 'ck'}" in start
    assert "done, 2 steps (21..22)" in done
    assert f"checkpoints: {tmp_path / 'ck'}; logs: {tmp_path / 'logs'}" in done


def test_quiet_prints_only_the_nothing_trained_warning():
    out = io.StringIO()
    progress = ConsoleProgress(quiet=True, stream=out)
    progress.start(
        world_size=1, mesh=(("dp_shard", 1),), resumed_from_step=None, steps=3, checkpoint_dir=None
    )
    progress.step(step=3, last_step=3, loss=1.0, seconds=0.1, tokens=10)
    progress.nothing_to_do(checkpoint_step=36, steps=20, checkpoint_dir=Path("ck"))
    progress.done(last_step=3, checkpoint_dir=None, log_dir=None, metrics_dir=None)
    assert len(_lines(out)) == 1
    assert "warning: the latest checkpoint in ck is at step 36, past --steps 20" in out.getvalue()


@pytest.mark.parametrize("every", [0, -1])
def test_log_every_must_be_positive(every):
    with pytest.raises(ConfigError, match="log_every: must be an integer >= 1"):
        ConsoleProgress(every=every)


def _config(tmp_path: Path, steps: int) -> TrainConfig:
    return TrainConfig(
        steps=steps,
        model=ModelConfig(d_model=32, n_heads=2, n_layers=1, max_seq_len=16),
        data=DataConfig(seq_len=16, micro_batch=2, corpus_max_bytes=1 << 14),
        checkpoint=CheckpointConfig(directory=tmp_path / "ck", every=100),
        telemetry=TelemetryConfig(log_dir=tmp_path / "logs"),
    )


def test_rerun_with_steps_below_the_checkpoint_warns_that_nothing_was_trained(tmp_path):
    from stormwatch.trainer.loop import train

    out = io.StringIO()
    first = train(_config(tmp_path, 3), RankEnv(), progress=ConsoleProgress(every=2, stream=out))
    assert first.last_step == 3
    lines = _lines(out)
    assert lines[0].startswith("train: world size 1, mesh dp_shard=1 x tp=1, fresh start")
    assert [line.split()[2] for line in lines[1:-1]] == ["2/3", "3/3"]
    assert lines[-1].startswith("train: done, 3 steps (1..3)")

    again = io.StringIO()
    second = train(_config(tmp_path, 2), RankEnv(), progress=ConsoleProgress(stream=again))
    assert (second.last_step, second.resumed_from_step) == (3, 3)
    assert "resumed from step 3" in again.getvalue()
    assert "is at step 3, past --steps 2: nothing was trained" in again.getvalue()
    steps = [e for e in read_events(tmp_path / "logs" / "rank0.jsonl") if e.event == "step"]
    assert len(steps) == 3  # the second run trained nothing
