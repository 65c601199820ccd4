"""Configs and parallel dimensions reject bad values with messages that name the field."""

from __future__ import annotations

import pytest

from stormwatch.errors import ConfigError
from stormwatch.trainer import ParallelDims, TrainerError
from stormwatch.trainer.config import (
    CheckpointConfig,
    DataConfig,
    DebugConfig,
    ModelConfig,
    OptimConfig,
    TelemetryConfig,
    TracingConfig,
    TrainConfig,
)


@pytest.mark.parametrize(
    ("dp", "tp", "world_size"),
    [(2, 2, 8), (2, 2, 2), (3, 1, 4), (1, 1, 2)],
)
def test_parallel_dims_reject_degrees_whose_product_is_not_the_world_size(dp, tp, world_size):
    with pytest.raises(ConfigError) as info:
        ParallelDims(dp=dp, tp=tp, world_size=world_size)
    message = str(info.value)
    assert f"dp={dp}" in message
    assert f"tp={tp}" in message
    assert f"world size is {world_size}" in message


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"dp": 0, "tp": 1, "world_size": 1}, "dp"),
        ({"dp": 1, "tp": -2, "world_size": 1}, "tp"),
        ({"dp": 1, "tp": 1, "world_size": 0}, "world_size"),
        ({"dp": 1.0, "tp": 1, "world_size": 1}, "dp"),
        ({"dp": True, "tp": 1, "world_size": 1}, "dp"),
    ],
)
def test_parallel_dims_reject_non_positive_integers(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}: must be an integer >= 1"):
        ParallelDims(**kwargs)


def test_parallel_dims_coordinates_keep_tp_ranks_adjacent():
    dims = ParallelDims(dp=2, tp=2, world_size=4)
    assert [dims.coordinate(r) for r in range(4)] == [
        {"dp": 0, "tp": 0},
        {"dp": 0, "tp": 1},
        {"dp": 1, "tp": 0},
        {"dp": 1, "tp": 1},
    ]
    assert dims.degrees == (("dp", 2), ("tp", 2))
    assert dims.dp_enabled and dims.tp_enabled
    with pytest.raises(ConfigError, match="rank"):
        dims.coordinate(4)


def test_parallel_dims_mesh_is_unavailable_before_it_is_built():
    dims = ParallelDims(dp=1, tp=1, world_size=1)
    with pytest.raises(TrainerError, match="build_mesh"):
        _ = dims.mesh
    with pytest.raises(KeyError, match="pp"):
        dims["pp"]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: ModelConfig(d_model=65, n_heads=4), "model.d_model"),
        (lambda: ModelConfig(dropout=1.0), "model.dropout"),
        (lambda: ModelConfig(n_layers=0), "model.n_layers"),
        (lambda: DataConfig(micro_batch=0), "data.micro_batch"),
        (lambda: DataConfig(seed=-1), "seed"),
        (lambda: DataConfig(seq_len=64, corpus_max_bytes=10), "data.corpus_max_bytes"),
        (lambda: OptimConfig(lr=0.0), "lr"),
        (lambda: OptimConfig(lr=float("nan")), "lr"),
        (lambda: CheckpointConfig(every=0), "checkpoint_every"),
        (lambda: CheckpointConfig(keep=0), "keep"),
        (lambda: TelemetryConfig(job=""), "job"),
        (lambda: TrainConfig(steps=0), "steps"),
        (lambda: TrainConfig(steps=1, step_delay=-1.0), "step_delay"),
        (lambda: TrainConfig(steps=1, tp=3), "tp"),
        (lambda: TrainConfig(steps=1, data=DataConfig(seq_len=128)), "seq_len"),
        (lambda: CheckpointConfig(mode="lazy"), "checkpoint_mode"),
        (lambda: TelemetryConfig(peak_flops=0.0), "peak_flops"),
        (lambda: DebugConfig(collective_timeout=0.5), "collective_timeout"),
        (lambda: DebugConfig(flight_recorder_entries=-1), "flight_recorder_entries"),
        (lambda: TracingConfig(otlp_endpoint="collector:4318"), "otlp_endpoint"),
        (lambda: TracingConfig(flush_timeout=0), "trace_flush_timeout"),
    ],
)
def test_configs_name_the_bad_field(build, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        build()


def test_checkpoint_dir_that_is_a_file_is_rejected(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ConfigError, match="checkpoint_dir"):
        CheckpointConfig(directory=path)
