"""End to end under real torchrun: 4 CPU ranks, FSDP2 (dp_shard=2) x TP (tp=2), gloo.

Runs share module-scoped fixtures to keep the tier short: one uninterrupted
run (rank 3 slowed before each backward pass, a straggler for FC-14; sleeping
changes no number), one run whose rank 1 is SIGKILLed at step 6 and resumed
by torchrun (--max-restarts 1), one resume over a damaged checkpoint folder (a
partial latest checkpoint, a stale temporary folder and a corrupt shard in the one
before), and one 4-step async-save run whose save of step 4 is killed at a different
phase in each of its first three attempts (--max-restarts 3). The faults are fault points
of the ranks' control files, written before the start (``slow_step``; ``kill_at_step``
and ``checkpoint_kill`` in the attempts they name).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from stormwatch.telemetry.events import read_events
from stormwatch.trainer.checkpoint import store

pytestmark = [pytest.mark.e2e, pytest.mark.untimed]

NPROC = 4
STEPS = 8
N_LAYERS = 2
FAULT_STEP = 6
FAULT_RANK = 1
SLOW_RANK = 3
SLOW_SECONDS = 0.25
TRAIN_ARGS = ["--dp", "2", "--tp", "2", "--steps", str(STEPS), "--checkpoint-every", "2"]
TRAIN_ARGS += ["--n-layers", str(N_LAYERS), "--job", "e2e"]


def _stormwatch() -> str:
    path = Path(sys.executable).with_name("stormwatch")
    return str(path) if path.exists() else shutil.which("stormwatch") or "stormwatch"


def _torchrun(
    torchrun_train,
    root: Path,
    *,
    control: dict[int, list[dict[str, Any]]] | None = None,
    max_restarts: int = 0,
    extra_args: tuple[str, ...] = (),
) -> Any:
    return torchrun_train(
        root,
        [*TRAIN_ARGS, *extra_args],
        nproc=NPROC,
        control=control,
        max_restarts=max_restarts,
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, torchrun_train) -> Any:
    run = _torchrun(
        torchrun_train,
        tmp_path_factory.mktemp("uninterrupted"),
        control={SLOW_RANK: [{"point": "slow_step", "seconds": SLOW_SECONDS}]},
    )
    assert run.returncode == 0, run.output[-5000:]
    print(f"\nuninterrupted torchrun: {run.seconds:.1f}s")
    return run


@pytest.fixture(scope="module")
def crashed_and_resumed(tmp_path_factory, torchrun_train) -> Any:
    run = _torchrun(
        torchrun_train,
        tmp_path_factory.mktemp("crashed"),
        control={FAULT_RANK: [{"point": "kill_at_step", "step": FAULT_STEP, "attempt": 0}]},
        max_restarts=1,
    )
    assert run.returncode == 0, run.output[-5000:]
    print(f"\ncrashed+resumed torchrun: {run.seconds:.1f}s")
    return run


def test_uninterrupted_run_logs_one_global_loss_per_step(uninterrupted):
    reference = uninterrupted.losses(0)
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert all(len(hexes) == 1 for hexes in reference.values())
    for rank in range(NPROC):  # the logged loss is the global mean: the same on every rank
        assert uninterrupted.losses(rank) == reference
        kinds = [e.event for e in uninterrupted.events(rank)]
        assert kinds[0] == "start" and kinds[-1] == "done"
        assert kinds.count("checkpoint") == STEPS // 2
        assert (uninterrupted.metrics / f"rank{rank}.done").exists()
    first, last = (float.fromhex(next(iter(reference[s]))) for s in (1, STEPS))
    assert last < first  # it learns
    found = store.scan(uninterrupted.checkpoints)
    assert [c.step for c in found.complete] == [4, 6, 8]  # keep=3
    assert found.partial == ()


def test_resume_after_sigkill_matches_uninterrupted_losses_bitwise(
    uninterrupted, crashed_and_resumed
):
    reference = {step: next(iter(hexes)) for step, hexes in uninterrupted.losses(0).items()}
    for rank in range(NPROC):
        losses = crashed_and_resumed.losses(rank)
        assert sorted(losses) == list(range(1, STEPS + 1)), f"rank {rank}"
        for step, hexes in losses.items():
            assert hexes == {reference[step]}, (
                f"rank {rank} step {step}: {hexes} != {reference[step]}"
            )
        starts = [e for e in crashed_and_resumed.events(rank) if e.event == "start"]
        assert [(s.attempt, s.resumed_from_step) for s in starts] == [(0, None), (1, 4)]
        done = [e for e in crashed_and_resumed.events(rank) if e.event == "done"]
        assert [(d.attempt, d.step) for d in done] == [(1, STEPS)]
    # the step after the last checkpoint ran in both attempts, with the same loss
    replayed = [e for e in crashed_and_resumed.events(0) if e.event == "step" and e.step == 5]
    assert [e.attempt for e in replayed] == [0, 1]


def _collect(metrics_dir: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def _value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def test_fc01_dead_rank_gauges_disappear(crashed_and_resumed):
    metrics = crashed_and_resumed.metrics
    pids = {
        rank: [e.pid for e in crashed_and_resumed.events(rank) if e.event == "start"]
        for rank in range(NPROC)
    }
    before = _collect(metrics)
    assert (
        _value(before, "stormwatch_train_step", training_job="e2e", rank=str(FAULT_RANK)) == STEPS
    )
    assert (
        _value(before, "stormwatch_train_node_restarts", training_job="e2e", rank=str(FAULT_RANK))
        == 1
    )
    assert (
        _value(before, "stormwatch_train_job_restarts", training_job="e2e", rank=str(FAULT_RANK))
        == 1
    )

    for pid in pids[FAULT_RANK]:  # both processes that ever were rank 1 have exited
        mark_process_dead(pid, path=str(metrics))
    after = _collect(metrics)
    rank = str(FAULT_RANK)
    for name in (
        "stormwatch_train_step",
        "stormwatch_train_loss",
        "stormwatch_train_last_step_timestamp_seconds",
        "stormwatch_train_world_size",
        "stormwatch_train_node_restarts",
        "stormwatch_train_job_restarts",
        "stormwatch_train_tokens_per_second",
    ):
        assert _value(after, name, training_job="e2e", rank=rank) is None, name
        assert _value(after, name, training_job="e2e", rank="0") is not None, (
            name
        )  # others untouched
    # counters stay: 5 steps in attempt 0 (killed at the start of step 6) + steps 5..8 in attempt 1
    assert _value(after, "stormwatch_train_steps_total", training_job="e2e", rank=rank) == 5 + 4
    assert _value(
        after, "stormwatch_collective_calls_total", training_job="e2e", rank=rank, op="all_gather"
    )


def test_collectives_of_each_step_are_counted_by_op(uninterrupted):
    samples = _collect(uninterrupted.metrics)
    per_step = {
        # FSDP2: root unshard + each block in forward and again in backward (on CPU every
        # block is resharded after forward, trainer/parallel/apply.py)
        "all_gather": 2 * N_LAYERS + 1,
        # FSDP2: one reduce-scatter per block and one for the root
        "reduce_scatter": N_LAYERS + 1,
        # TP: 2 per block in forward (wo, w2), 4 in backward (inputs of wq, wk, wv, w1),
        # plus the loss all-reduce over dp
        "all_reduce": 6 * N_LAYERS + 1,
    }
    for rank in map(str, range(NPROC)):
        for op, count in per_step.items():
            calls = _value(
                samples, "stormwatch_collective_calls_total", training_job="e2e", rank=rank, op=op
            )
            assert calls == STEPS * count, (rank, op, calls)
            assert (
                _value(
                    samples,
                    "stormwatch_collective_bytes_total",
                    training_job="e2e",
                    rank=rank,
                    op=op,
                )
                > 0
            )
            seconds = _value(
                samples,
                "stormwatch_collective_duration_seconds_total",
                training_job="e2e",
                rank=rank,
                op=op,
            )
            assert seconds is not None and seconds > 0
        assert (
            _value(samples, "stormwatch_train_steps_total", training_job="e2e", rank=rank) == STEPS
        )
        assert (
            _value(samples, "stormwatch_train_world_size", training_job="e2e", rank=rank) == NPROC
        )


def test_fc14_straggler_waits_least_inside_collectives(uninterrupted):
    samples = _collect(uninterrupted.metrics)

    def waited(rank: int) -> float:
        return sum(
            value
            for (name, labels), value in samples.items()
            if name == "stormwatch_collective_duration_seconds_total"
            and ("rank", str(rank)) in labels
        )

    injected = STEPS * SLOW_SECONDS
    culprit = waited(SLOW_RANK)
    for victim in set(range(NPROC)) - {SLOW_RANK}:  # they wait for the straggler inside collectives
        assert waited(victim) > culprit + injected / 2, (victim, waited(victim), culprit)


@pytest.fixture(scope="module")
def resumed_over_damage(uninterrupted, tmp_path_factory, torchrun_train) -> Any:
    """A copy of the uninterrupted run's checkpoints (4, 6, 8), damaged three ways, resumed:
    the save of step 8 was killed after its shards were written (no .metadata, no marker),
    an attempt died inside its temporary folder, and a shard of step 6 has flipped bytes.
    One run checks the partial and the corrupt cases (each its own torchrun job before)."""
    root = tmp_path_factory.mktemp("damaged")
    shutil.copytree(uninterrupted.checkpoints, root / "ckpt")
    latest = root / "ckpt" / store.step_dir_name(STEPS)
    (latest / store.METADATA_NAME).unlink()
    (latest / store.MARKER_NAME).unlink()
    stale = root / "ckpt" / store.tmp_dir_name(STEPS, attempt=3, token="deadbeef")
    stale.mkdir()
    shutil.copy(latest / "__0_0.distcp", stale / "__0_0.distcp")
    shard = root / "ckpt" / store.step_dir_name(STEPS - 2) / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit pattern in the middle of a tensor
    shard.write_bytes(bytes(data))

    run = _torchrun(torchrun_train, root)
    print(f"\nresume over a damaged checkpoint folder: {run.seconds:.1f}s")
    assert run.returncode == 0, run.output[-5000:]
    return run


def test_fc11_partial_checkpoint_is_skipped_and_its_step_saved_again(
    uninterrupted, resumed_over_damage
):
    run = resumed_over_damage
    latest = run.checkpoints / store.step_dir_name(STEPS)
    stale = run.checkpoints / store.tmp_dir_name(STEPS, attempt=3, token="deadbeef")
    assert f"skipping partial checkpoint {latest}" in run.output
    assert f"skipping partial checkpoint {stale}" in run.output
    reference = uninterrupted.losses(0)
    for rank in range(NPROC):
        # step 8 partial, step 6 corrupt: from step 4
        start = run.events(rank)[0]
        assert start.event == "start" and start.resumed_from_step == STEPS - 4
        assert run.losses(rank) == {s: reference[s] for s in range(STEPS - 3, STEPS + 1)}
        saved = [e.step for e in run.events(rank) if e.event == "checkpoint"]
        assert saved == [STEPS - 2, STEPS]
    found = store.scan(run.checkpoints)
    assert [c.step for c in found.complete] == [4, 6, 8]
    assert found.partial == ()  # pruned after the new save was committed
    assert store.sound(latest)
    # the damaged steps 6 and 8 were set aside at resume, kept (not this run's to delete)
    aside = sorted(p.name[:13] for p in run.checkpoints.iterdir() if store.DAMAGED_INFIX in p.name)
    assert aside == [store.step_dir_name(STEPS - 2), store.step_dir_name(STEPS)]


def test_single_process_without_torchrun_runs_as_world_size_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run(
        [_stormwatch(), "train", "--steps", "2", "--log-dir", str(tmp_path / "logs"),
         "--metrics-dir", str(tmp_path / "metrics"), "--seq-len", "32", "--n-layers", "1"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    events = read_events(tmp_path / "logs" / "rank0.jsonl")
    assert [e.event for e in events] == ["start", "step", "step", "done"]
    assert (tmp_path / "metrics" / "rank0.done").exists()


def test_fc14_slow_rank_has_lowest_collective_wait_and_highest_compute(uninterrupted):
    """4 gloo ranks, rank 3 slowed before each backward: the per-rank split names it."""
    samples = _collect(uninterrupted.metrics)

    def per_rank(name: str) -> dict[int, float]:
        return {r: _value(samples, name, training_job="e2e", rank=str(r)) for r in range(NPROC)}

    wait = per_rank("stormwatch_train_collective_wait_seconds_total")
    compute = per_rank("stormwatch_train_compute_seconds_total")
    assert min(wait, key=wait.__getitem__) == SLOW_RANK, wait
    assert max(compute, key=compute.__getitem__) == SLOW_RANK, compute
    injected = STEPS * SLOW_SECONDS
    for victim in set(range(NPROC)) - {SLOW_RANK}:
        assert wait[victim] > wait[SLOW_RANK] + injected / 2, (victim, wait)
    last_wait = per_rank("stormwatch_train_step_collective_wait_seconds")
    last_compute = per_rank("stormwatch_train_step_compute_seconds")
    assert last_compute[SLOW_RANK] > SLOW_SECONDS
    assert all(value >= 0 for value in [*last_wait.values(), *last_compute.values()])


def test_collectives_are_labelled_by_mesh_dim_with_nccl_tests_bandwidths(uninterrupted):
    samples = _collect(uninterrupted.metrics)
    per_step = {("dp_shard", "all_gather"): 2 * N_LAYERS + 1}
    per_step |= {("dp_shard", "reduce_scatter"): N_LAYERS + 1}
    per_step |= {("tp", "all_reduce"): 6 * N_LAYERS, ("dp_shard", "all_reduce"): 1}
    for rank in map(str, range(NPROC)):
        for (mesh_dim, op), count in per_step.items():
            labels = {"training_job": "e2e", "rank": rank, "mesh_dim": mesh_dim, "op": op}
            calls = _value(samples, "stormwatch_collective_latency_seconds_count", **labels)
            assert calls == STEPS * count, (labels, calls)
            assert _value(samples, "stormwatch_collective_size_bytes_total", **labels) > 0
            algbw = _value(samples, "stormwatch_collective_algbw_bytes_per_second", **labels)
            busbw = _value(samples, "stormwatch_collective_busbw_bytes_per_second", **labels)
            factor = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5}[op]  # n = 2
            assert algbw > 0 and busbw == pytest.approx(algbw * factor), labels


def test_grad_norm_mfu_and_memory_are_exported_per_rank(uninterrupted):
    samples = _collect(uninterrupted.metrics)
    norms = {
        _value(samples, "stormwatch_train_grad_norm", training_job="e2e", rank=str(r))
        for r in range(NPROC)
    }
    assert len(norms) == 1 and next(iter(norms)) > 0  # a global norm: the same on every rank
    for rank in map(str, range(NPROC)):
        assert 0 < _value(samples, "stormwatch_train_mfu_ratio", training_job="e2e", rank=rank) < 1
        assert (
            _value(samples, "stormwatch_train_peak_flops_per_second", training_job="e2e", rank=rank)
            == 1e11
        )
        assert (
            _value(
                samples, "stormwatch_train_memory_bytes", training_job="e2e", rank=rank, kind="rss"
            )
            > 0
        )
        errors = [k for k in samples if k[0] == "stormwatch_train_telemetry_errors_total"]
        assert errors == []


def test_fc07_spans_from_every_rank_process_are_exported(uninterrupted):
    """torchrun execs the ranks; each sets up tracing itself and flushes it on exit."""
    import json

    for rank in range(NPROC):
        path = uninterrupted.logs / "spans" / f"rank{rank}.jsonl"
        spans = [json.loads(line) for line in path.read_text().splitlines()]
        steps = {
            s["context"]["span_id"]: s["attributes"]["step"] for s in spans if s["name"] == "step"
        }
        assert sorted(steps.values()) == list(range(1, STEPS + 1))
        for name in ("forward", "backward", "optimizer"):
            parents = [steps[s["parent_id"]] for s in spans if s["name"] == name]
            assert sorted(parents) == list(range(1, STEPS + 1)), name
        saves = sorted(s["attributes"]["step"] for s in spans if s["name"] == "checkpoint_save")
        assert saves == list(range(2, STEPS + 1, 2))
        assert [s["name"] for s in spans].count("checkpoint_load") == 1
        assert {s["resource"]["attributes"]["rank"] for s in spans} == {rank}


def test_corrupt_shard_resumes_from_the_previous_checkpoint_with_a_warning(
    uninterrupted, resumed_over_damage
):
    run = resumed_over_damage
    corrupt = run.checkpoints / store.step_dir_name(STEPS - 2)
    assert f"skipping corrupt checkpoint {corrupt}: checksum mismatch in __1_0.distcp" in run.output
    reference = uninterrupted.losses(0)
    for rank in range(NPROC):
        assert run.events(rank)[0].resumed_from_step == STEPS - 4
        assert run.losses(rank) == {s: reference[s] for s in range(STEPS - 3, STEPS + 1)}
    assert store.sound(corrupt)  # saved again over the corrupt one


#: (phase, rank, attempt): the save of step 4 is killed at ``phase`` on ``rank`` in ``attempt``
ASYNC_KILLS = [("before_shards", 1, 0), ("before_metadata", 0, 1), ("before_marker", 0, 2)]
#: The async job stops at the killed save's step: its last attempt resumes from step 2 and
#: saves step 4 again (steps 5..8 and two more async saves per rank told nothing more).
#: ``--keep 1``: committing step 4 prunes step 2, so a prune that ran before the async save
#: was durable (FC-11) would leave the killed attempts nothing to resume from.
ASYNC_STEPS = 4


@pytest.fixture(scope="module")
def async_save_killed(tmp_path_factory, torchrun_train) -> Any:
    """--checkpoint-mode async; the save of step 4 SIGKILLed at one phase in each of the
    first three attempts, so that each resume meets what the kills before it left (one job
    of four attempts instead of one job of two attempts per phase)."""
    control: dict[int, list[dict[str, Any]]] = {}
    for phase, rank, attempt in ASYNC_KILLS:
        entry = {"point": "checkpoint_kill", "phase": phase, "step": 4, "attempt": attempt}
        control.setdefault(rank, []).append(entry)
    run = _torchrun(
        torchrun_train,
        tmp_path_factory.mktemp("async-killed"),
        control=control,
        max_restarts=len(ASYNC_KILLS),
        extra_args=("--checkpoint-mode", "async", "--steps", str(ASYNC_STEPS), "--keep", "1"),
    )
    print(f"\nasync save killed at {len(ASYNC_KILLS)} phases: {run.seconds:.1f}s")
    assert run.returncode == 0, run.output[-5000:]
    return run


@pytest.mark.parametrize(("phase", "rank", "attempt"), ASYNC_KILLS)
def test_fc11_async_save_killed_at_each_phase_resumes_from_last_complete_bitwise(
    uninterrupted, async_save_killed, phase, rank, attempt
):
    """--checkpoint-mode async; a rank SIGKILLed at one phase of the save of step 4."""
    run = async_save_killed
    assert f"SIGKILL at {phase} of the save of step 4" in run.output
    reference = {step: next(iter(hexes)) for step, hexes in uninterrupted.losses(0).items()}
    for r in range(NPROC):
        losses = run.losses(r)
        assert sorted(losses) == list(range(1, ASYNC_STEPS + 1)), r
        for step, hexes in losses.items():
            assert hexes == {reference[step]}, (r, step)
        starts = [e for e in run.events(r) if e.event == "start"]
        resumed = [(a, 2) for a in range(1, len(ASYNC_KILLS) + 1)]
        assert [(s.attempt, s.resumed_from_step) for s in starts] == [(0, None), *resumed]
        events = [(e.event, getattr(e, "step", None), e.attempt) for e in run.events(r)]
        # training went on while step 2 was written: committed only after step 3 ran
        assert events.index(("checkpoint", 2, 0)) > events.index(("step", 3, 0))
        assert ("step", 4, attempt) in events  # the step ran, its save was killed ...
        assert ("checkpoint", 4, attempt) not in events  # ... and never counted
        assert {("checkpoint", 4, 3), ("done", ASYNC_STEPS, 3)} <= set(events)  # saved again
    found = store.scan(run.checkpoints)
    assert [c.step for c in found.complete] == [4]  # step 2 pruned once step 4 committed
    assert found.partial == ()


def test_checkpoint_freshness_is_exported_for_the_staleness_alert(uninterrupted):
    samples = _collect(uninterrupted.metrics)
    for rank in map(str, range(NPROC)):
        labels = {"training_job": "e2e", "rank": rank}
        assert _value(samples, "stormwatch_train_checkpoint_interval_steps", **labels) == 2
        stamp = _value(samples, "stormwatch_train_last_checkpoint_timestamp_seconds", **labels)
        assert stamp is not None and time.time() - 600 < stamp <= time.time()
