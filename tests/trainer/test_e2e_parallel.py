"""End to end under real torchrun, 4 CPU ranks on gloo: pipeline (pp=2 x dp_shard=2) and HSDP.

Module-scoped runs keep the tier short: one uninterrupted pp=2 x dp=2 run
(1F1B, 2 micro-batches of 2 sequences), the same run with rank 1 SIGKILLed at
step 5 (a ``kill_at_step`` fault point of its control file, attempt 0) and resumed
by torchrun from the checkpoint of step 4, and a short
HSDP run (dp_replicate=2 x dp_shard=2).
"""

from __future__ import annotations

import pytest
from torch.distributed.checkpoint import FileSystemReader

from stormwatch.trainer.checkpoint import store

pytestmark = [pytest.mark.e2e, pytest.mark.untimed]

NPROC = 4
STEPS = 6
FAULT_STEP = 5
FAULT_RANK = 1
N_LAYERS = 2
MICRO_BATCH, SEQ_LEN, D_MODEL, MICROBATCHES = 4, 64, 64, 2
PP_ARGS = ["--pp", "2", "--dp", "2", "--pp-schedule", "1F1B", "--pp-microbatches", "2"]
PP_ARGS += ["--steps", str(STEPS), "--checkpoint-every", "2", "--n-layers", str(N_LAYERS)]
PP_ARGS += ["--micro-batch", str(MICRO_BATCH), "--seq-len", str(SEQ_LEN)]
PP_ARGS += ["--d-model", str(D_MODEL), "--job", "pp"]


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory, torchrun_train):
    run = torchrun_train(tmp_path_factory.mktemp("pp"), PP_ARGS, nproc=NPROC)
    assert run.returncode == 0, run.output[-5000:]
    print(f"\npp=2 x dp=2 torchrun: {run.seconds:.1f}s")
    return run


@pytest.fixture(scope="module")
def pipelined_crashed(tmp_path_factory, torchrun_train):
    run = torchrun_train(
        tmp_path_factory.mktemp("pp-crashed"),
        PP_ARGS,
        nproc=NPROC,
        control={FAULT_RANK: [{"point": "kill_at_step", "step": FAULT_STEP, "attempt": 0}]},
        max_restarts=1,
    )
    assert run.returncode == 0, run.output[-5000:]
    print(f"\npp=2 x dp=2 crashed+resumed torchrun: {run.seconds:.1f}s")
    return run


def _value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def test_every_pipeline_stage_logs_the_last_stages_global_loss(pipelined):
    reference = pipelined.losses(0)
    assert sorted(reference) == list(range(1, STEPS + 1))
    for rank in range(NPROC):  # ranks 0, 1 are stage 0 (no loss of their own)
        assert pipelined.losses(rank) == reference, f"rank {rank}"
    first, last = (float.fromhex(next(iter(reference[s]))) for s in (1, STEPS))
    assert last < first  # it learns


def test_pp_resume_after_sigkill_matches_uninterrupted_losses_bitwise(pipelined, pipelined_crashed):
    reference = {step: next(iter(hexes)) for step, hexes in pipelined.losses(0).items()}
    for rank in range(NPROC):
        losses = pipelined_crashed.losses(rank)
        assert sorted(losses) == list(range(1, STEPS + 1)), f"rank {rank}"
        for step, hexes in losses.items():
            assert hexes == {reference[step]}, f"rank {rank} step {step}"
        starts = [e for e in pipelined_crashed.events(rank) if e.event == "start"]
        assert [(s.attempt, s.resumed_from_step) for s in starts] == [(0, None), (1, 4)]


def test_pp_checkpoint_holds_every_stages_parameters_under_unsplit_names(pipelined):
    latest = store.scan(pipelined.checkpoints).complete[-1]
    keys = set(FileSystemReader(str(latest.path)).read_metadata().state_dict_metadata)
    # stage 0 saved the embeddings and block 0, stage 1 block 1, the final norm and the head
    for name in ("tok_emb.weight", "layers.0.attn.wq.weight", "layers.1.mlp.w2.bias"):
        assert f"model.{name}" in keys
    assert {"model.norm.weight", "model.head.weight"} <= keys
    assert any(k.startswith("optim.state.layers.1.") for k in keys)


def test_pp_send_and_recv_are_counted_with_the_activation_size(pipelined):
    samples = pipelined.samples()
    activation = (MICRO_BATCH // MICROBATCHES) * SEQ_LEN * D_MODEL * 4  # float32 bytes
    vote = 4  # one int32 each way before the first step (pipelining's warm-up vote)
    for rank in map(str, range(NPROC)):
        # stage 0 sends activations and receives their gradients, stage 1 the reverse:
        # the same size, once per micro-batch per step
        for op in ("send", "recv"):
            labels = {"training_job": "pp", "rank": rank, "mesh_dim": "pp", "op": op}
            calls = _value(samples, "stormwatch_collective_latency_seconds_count", **labels)
            assert calls == STEPS * MICROBATCHES + 1, (labels, calls)
            size = _value(samples, "stormwatch_collective_size_bytes_total", **labels)
            assert size == STEPS * MICROBATCHES * activation + vote, (labels, size)
            seconds = _value(samples, "stormwatch_collective_latency_seconds_sum", **labels)
            assert seconds is not None and seconds > 0
            algbw = _value(samples, "stormwatch_collective_algbw_bytes_per_second", **labels)
            busbw = _value(samples, "stormwatch_collective_busbw_bytes_per_second", **labels)
            assert algbw > 0 and busbw == pytest.approx(algbw)  # point-to-point: factor 1
        # the loss reaches stage 0 through one all-reduce over pp per step
        labels = {"training_job": "pp", "rank": rank, "mesh_dim": "pp", "op": "all_reduce"}
        assert _value(samples, "stormwatch_collective_latency_seconds_count", **labels) == STEPS


def test_pp_gradient_norm_covers_every_stage(pipelined):
    samples = pipelined.samples()
    norms = {
        _value(samples, "stormwatch_train_grad_norm", training_job="pp", rank=str(r))
        for r in range(NPROC)
    }
    assert len(norms) == 1 and next(iter(norms)) > 0  # stage 0 and stage 1 agree


def test_hsdp_all_reduces_gradients_across_replicas_and_logs_one_loss(tmp_path, torchrun_train):
    args = ["--dp-replicate", "2", "--dp", "2", "--steps", "2", "--n-layers", "1"]
    run = torchrun_train(tmp_path, [*args, "--job", "hsdp"], nproc=NPROC)
    assert run.returncode == 0, run.output[-5000:]
    reference = run.losses(0)
    assert sorted(reference) == [1, 2]
    assert all(run.losses(rank) == reference for rank in range(NPROC))
    samples = run.samples()
    for rank in map(str, range(NPROC)):
        count = "stormwatch_collective_latency_seconds_count"
        shard = {"training_job": "hsdp", "rank": rank, "mesh_dim": "dp_shard"}
        replicate = {"training_job": "hsdp", "rank": rank, "mesh_dim": "dp_replicate"}
        # reduce-scatter inside the replica, then all-reduce of the shards across
        # replicas, per FSDP unit (1 block + root); plus the loss all-reduce
        assert _value(samples, count, op="reduce_scatter", **shard) == 2 * 2
        assert _value(samples, count, op="all_reduce", **replicate) == 2 * (2 + 1)
