"""The Lightning callback on real Lightning jobs: examples/lightning/train.py under torchrun
(2 CPU ranks, gloo, DDP) reports what the reference trainer does (start, steps with the
loss, checkpoints, done; the metrics with collectives counted and the pauses as phases),
and resumes from its last checkpoint, saying so; a fit that raises leaves a dump and no
done marker, and a count function that raises costs a warning, not the training.
(On the lab, with the chaos and alert paths: test_lightning_lab.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from stormwatch.telemetry.dump import rank_dump_paths
from stormwatch.telemetry.events import CheckpointEvent, StartEvent
from stormwatch.telemetry.integrations.lightning import launched_per_rank
from stormwatch.telemetry.ranklogs import read_job_logs

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "lightning" / "train.py"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def _environment(tmp_path: Path) -> dict[str, str]:
    folders = {
        "STORMWATCH_METRICS_DIR": tmp_path / "metrics",
        "STORMWATCH_LOG_DIR": tmp_path / "logs",
        "STORMWATCH_DUMP_DIR": tmp_path / "logs" / "dumps",
        "STORMWATCH_CHECKPOINT_DIR": tmp_path / "checkpoints",
    }
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "SLURM_"))}
    env = {**keep, **{k: str(v) for k, v in folders.items()}}
    return {**env, "STORMWATCH_JOB": "pl", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _train(tmp_path: Path, *args: str) -> None:
    done = subprocess.run(
        [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(EXAMPLE), *args],
        env=_environment(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


def _metrics(folder: Path) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(folder))
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in registry.collect()
        for sample in family.samples
    }


def _value(metrics: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str):
    wanted = {("training_job", "pl"), *labels.items()}
    found = [v for (n, ls), v in metrics.items() if n == name and wanted <= ls]
    assert found, f"no {name} {labels}"
    return found[0] if len(found) == 1 else found


@pytest.mark.e2e
@pytest.mark.untimed
@pytest.mark.timeout(600)
def test_a_lightning_ddp_job_reports_like_the_trainer_and_resumes_from_its_last_checkpoint(
    tmp_path: Path,
) -> None:
    _train(tmp_path, "--max-steps", "6", "--checkpoint-every", "3", "--val-every", "2")
    logs = read_job_logs(tmp_path / "logs")
    assert sorted(logs) == [0, 1]
    for rank, log in logs.items():
        [start] = log.starts
        assert (start.world_size, start.attempt, start.resumed_from_step) == (2, 0, None)
        assert [e.step for e in log.steps] == [1, 2, 3, 4, 5, 6], rank
        assert all(e.loss is not None and e.loss_hex == float.hex(e.loss) for e in log.steps)
        saved = [e.step for e in log.events if isinstance(e, CheckpointEvent)]
        assert saved == [3, 6] and log.finished, rank
    assert {p.name for p in (tmp_path / "metrics").glob("rank*.done")} == {
        "rank0.done",
        "rank1.done",
    }
    metrics = _metrics(tmp_path / "metrics")
    for rank in ("0", "1"):
        assert _value(metrics, "stormwatch_train_steps_total", rank=rank) == 6
        assert _value(metrics, "stormwatch_train_samples_total", rank=rank) == 6 * 64
        assert _value(metrics, "stormwatch_train_learning_rate", rank=rank) == pytest.approx(1e-3)
        assert _value(metrics, "stormwatch_train_grad_norm", rank=rank) > 0
        # DDP's gradient all-reduce is counted (a bucket a step, at least), and timed
        calls = _value(metrics, "stormwatch_collective_calls_total", rank=rank, op="all_reduce")
        assert calls >= 6
        assert _value(metrics, "stormwatch_train_collective_wait_seconds_total", rank=rank) > 0
        # validation and saves were phases, each left (deadline back to 0)
        for phase in ("eval", "checkpoint_save"):
            deadline = "stormwatch_train_phase_deadline_timestamp_seconds"
            assert _value(metrics, deadline, rank=rank, phase=phase) == 0, phase

    # A second start trains on to step 9 from the step-6 checkpoint (fit(ckpt_path="last")).
    _train(tmp_path, "--max-steps", "9", "--checkpoint-every", "3")
    for rank, log in read_job_logs(tmp_path / "logs").items():
        assert [(s.attempt, s.resumed_from_step) for s in log.starts] == [(0, None), (0, 6)]
        resumed = log.since_restart(log.starts[1].time - 1e-3)
        assert [e.step for e in resumed if e.event == "step"] == [7, 8, 9], rank
        assert [e.step for e in resumed if isinstance(e, CheckpointEvent)] == [9]
        assert log.finished
    assert isinstance(read_job_logs(tmp_path / "logs")[0].events[0], StartEvent)
    metrics = _metrics(tmp_path / "metrics")
    deadline = "stormwatch_train_phase_deadline_timestamp_seconds"
    assert _value(metrics, deadline, rank="0", phase="checkpoint_load") == 0


FAILING = """
import sys
sys.path.insert(0, {example_dir!r})
import pytorch_lightning as pl
import train
from stormwatch.telemetry.integrations.lightning import StormwatchCallback


class Failing(train.Regressor):
    def training_step(self, batch, batch_idx):
        if self.global_step == 3:
            raise RuntimeError("the data went bad at step 4")
        return super().training_step(batch, batch_idx)


args = train.parse_args(["--max-steps", "6"])
trainer = pl.Trainer(
    accelerator="cpu", devices=1, max_steps=6, logger=False, enable_progress_bar=False,
    enable_model_summary=False, enable_checkpointing=False,
    callbacks=[StormwatchCallback(tokens=lambda batch: 1 // 0)],
)
trainer.fit(Failing(args))
"""


@pytest.mark.timeout(300)
def test_a_fit_that_raises_leaves_a_dump_and_no_done_marker_and_a_bad_count_only_warns(
    tmp_path: Path,
) -> None:
    script = tmp_path / "failing.py"
    script.write_text(textwrap.dedent(FAILING.format(example_dir=str(EXAMPLE.parent))))
    done = subprocess.run(
        [sys.executable, str(script)],
        env=_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-4000:]
    assert "RuntimeError: the data went bad at step 4" in done.stderr
    # the tokens function raised: one warning, and the steps were still marked
    warning = "tokens(batch) failed (ZeroDivisionError: integer division or modulo by zero)"
    assert done.stderr.count(warning) == 1, done.stderr[-4000:]
    [log] = read_job_logs(tmp_path / "logs").values()
    assert [e.step for e in log.steps] == [1, 2, 3] and not log.finished
    assert not list((tmp_path / "metrics").glob("rank*.done"))
    [path] = rank_dump_paths(tmp_path / "logs" / "dumps", 0)  # its one incarnation's
    dump = path.read_text()
    assert "RuntimeError: the data went bad at step 4" in dump


@pytest.mark.timeout(300)
def test_a_fit_interrupted_by_ctrl_c_writes_no_done_marker(tmp_path: Path) -> None:
    """Lightning turns a KeyboardInterrupt into sys.exit(1) without an exception."""
    script = tmp_path / "interrupted.py"
    failing = FAILING.format(example_dir=str(EXAMPLE.parent))
    failing = failing.replace(
        'raise RuntimeError("the data went bad at step 4")', "raise KeyboardInterrupt"
    )
    script.write_text(textwrap.dedent(failing).replace("tokens=lambda batch: 1 // 0", ""))
    done = subprocess.run(
        [sys.executable, str(script)],
        env=_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-4000:]
    [log] = read_job_logs(tmp_path / "logs").values()
    assert [e.step for e in log.steps] == [1, 2, 3] and not log.finished
    assert not list((tmp_path / "metrics").glob("rank*.done"))


@pytest.mark.parametrize(
    ("environ", "per_rank"),
    [
        ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, True),  # torchrun
        ({"SLURM_PROCID": "3", "SLURM_NTASKS": "8"}, True),  # srun
        ({"LOCAL_RANK": "1", "NODE_RANK": "0"}, False),  # Lightning's own launcher's child
        ({"SLURM_JOB_ID": "7"}, False),  # a batch script, no task
        ({}, False),
    ],
)
def test_the_callback_initialises_at_once_only_in_a_process_a_launcher_made_a_rank(
    environ: dict[str, str], per_rank: bool
) -> None:
    assert launched_per_rank(environ) is per_rank
