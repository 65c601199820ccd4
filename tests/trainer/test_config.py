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
    ("degrees", "world_size", "named"),
    [
        ({"dp_shard": 2, "tp": 2}, 8, "pp=1 x dp_replicate=1 x dp_shard=2 x tp=2 = 4 ranks"),
        ({"dp_shard": 2, "tp": 2}, 2, "dp_shard=2 x tp=2 = 4 ranks"),
        ({"dp_shard": 3}, 4, "dp_shard=3 x tp=1 = 3 ranks"),
        ({}, 2, "pp=1 x dp_replicate=1 x dp_shard=1 x tp=1 = 1 ranks"),
        ({"pp": 2, "dp_shard": 2}, 8, "pp=2 x dp_replicate=1 x dp_shard=2 x tp=1 = 4 ranks"),
        ({"pp": 3, "dp_shard": 2}, 4, "pp=3 x dp_replicate=1 x dp_shard=2"),
        ({"dp_replicate": 2, "dp_shard": 2}, 2, "dp_replicate=2 x dp_shard=2 x tp=1 = 4"),
        ({"pp": 2, "dp_replicate": 2, "dp_shard": 2, "tp": 2}, 8, "= 16 ranks"),
    ],
)
def test_parallel_dims_reject_degrees_whose_product_is_not_the_world_size(
    degrees, world_size, named
):
    with pytest.raises(ConfigError) as info:
        ParallelDims(**degrees, world_size=world_size)
    message = str(info.value)
    assert named in message
    assert f"but the world size is {world_size}" in message
    assert f"choose degrees whose product is {world_size}" in message


@pytest.mark.parametrize(
    ("degrees", "world_size"),
    [
        ({"pp": 2, "dp_shard": 2}, 4),
        ({"dp_replicate": 2, "dp_shard": 2}, 4),
        ({"pp": 2, "dp_replicate": 2, "dp_shard": 2, "tp": 2}, 16),
        ({"tp": 4}, 4),
    ],
)
def test_parallel_dims_accept_degrees_whose_product_is_the_world_size(degrees, world_size):
    dims = ParallelDims(**degrees, world_size=world_size)
    assert dict(dims.degrees) == {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1, **degrees}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"dp_shard": 0, "tp": 1, "world_size": 1}, "dp_shard"),
        ({"dp_shard": 1, "tp": -2, "world_size": 1}, "tp"),
        ({"pp": 0}, "pp"),
        ({"dp_replicate": -1}, "dp_replicate"),
        ({"dp_shard": 1, "tp": 1, "world_size": 0}, "world_size"),
        ({"dp_shard": 1.0, "tp": 1, "world_size": 1}, "dp_shard"),
        ({"pp": True}, "pp"),
    ],
)
def test_parallel_dims_reject_non_positive_integers(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}: must be an integer >= 1"):
        ParallelDims(**kwargs)


def test_parallel_dims_coordinates_keep_tp_ranks_adjacent():
    dims = ParallelDims(dp_shard=2, tp=2, world_size=4)
    assert [dims.coordinate(r) for r in range(4)] == [
        {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "tp": 0},
        {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "tp": 1},
        {"pp": 0, "dp_replicate": 0, "dp_shard": 1, "tp": 0},
        {"pp": 0, "dp_replicate": 0, "dp_shard": 1, "tp": 1},
    ]
    assert dims.mesh_degrees == (("dp_shard", 2), ("tp", 2))
    assert dims.dp_enabled and dims.tp_enabled and not dims.pp_enabled
    with pytest.raises(ConfigError, match="rank"):
        dims.coordinate(4)


def test_pipeline_stages_are_outermost_and_data_parallel_ranks_span_replicas_and_shards():
    dims = ParallelDims(pp=2, dp_replicate=2, dp_shard=2, world_size=8)
    assert dims.mesh_degrees == (("pp", 2), ("dp_replicate", 2), ("dp_shard", 2), ("tp", 1))
    assert [dims.coordinate(r)["pp"] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    # each stage sees the same dp batches: 4 of them, replica-major
    assert [dims.dp_rank(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert dims.dp == 4


def test_parallel_dims_mesh_is_unavailable_before_it_is_built():
    dims = ParallelDims(world_size=1)
    with pytest.raises(TrainerError, match="build_mesh"):
        _ = dims.mesh
    with pytest.raises(KeyError, match="pp"):
        dims["pp"]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: ModelConfig(d_model=65, n_heads=4), "d_model"),
        (lambda: ModelConfig(dropout=1.0), "dropout"),
        (lambda: ModelConfig(n_layers=0), "n_layers"),
        (lambda: DataConfig(micro_batch=0), "micro_batch"),
        (lambda: DataConfig(seed=-1), "seed"),
        (lambda: DataConfig(seq_len=64, corpus_max_bytes=10), "corpus_max_bytes"),
        (lambda: OptimConfig(lr=0.0), "lr"),
        (lambda: OptimConfig(lr=float("nan")), "lr"),
        (lambda: CheckpointConfig(every=0), "checkpoint_every"),
        (lambda: CheckpointConfig(keep=0), "keep"),
        (lambda: TelemetryConfig(job=""), "job"),
        (lambda: TrainConfig(steps=0), "steps"),
        (lambda: TrainConfig(steps=1, step_delay=-1.0), "step_delay"),
        (lambda: TrainConfig(steps=1, tp=3), "tp"),
        (lambda: TrainConfig(steps=1, data=DataConfig(seq_len=128)), "seq_len"),
        (lambda: TrainConfig(steps=1, pp=0), "pp"),
        (lambda: TrainConfig(steps=1, dp_replicate=0), "dp_replicate"),
        (lambda: TrainConfig(steps=1, pp=2, pp_schedule="Interleaved1F1B"), "pp_schedule"),
        (lambda: TrainConfig(steps=1, pp=2, pp_microbatches=-1), "pp_microbatches"),
        (lambda: TrainConfig(steps=1, pp=3), "pp"),  # 2 layers cannot fill 3 stages
        (lambda: TrainConfig(steps=1, pp=2, pp_microbatches=3), "pp_microbatches"),  # 4 % 3
        (lambda: TrainConfig(steps=1, pp_microbatches=3), "pp_microbatches"),  # 4 % 3, pp=1 too
        (lambda: TrainConfig(steps=1, pp=2, pp_microbatches=1), "pp_microbatches"),  # 1F1B: >= pp
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
