"""The rank event log's one model: what the writer writes, every reader reads back."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stormwatch.telemetry.events import (
    CheckpointEvent,
    CheckpointFailedEvent,
    DoneEvent,
    EventLog,
    FaultEvent,
    StartEvent,
    StepEvent,
    log_path,
    parse_event,
    read_events,
)
from stormwatch.telemetry.ranklogs import (
    RankLog,
    current_world_size,
    final_losses,
    last_completed_step,
    read_job_logs,
    read_rank_log,
)


def _write_every_kind(log_dir: Path, *, world_size: int | None = 4, loss: float = 0.5) -> Path:
    clock = iter(float(t) for t in range(100, 200))
    log = EventLog(log_dir, rank=1, attempt=2, clock=lambda: next(clock), world_size=world_size)
    log.start(resumed_from_step=None)
    log.step(step=1, loss=loss, step_seconds=0.25)
    log.checkpoint(step=1)
    log.checkpoint_failed(step=2, error="rank 0: OSError: disk full")
    log.fault(point="slow_step", step=2)
    log.done(step=2)
    log.close()
    return log.path


def test_the_writer_writes_the_same_bytes_as_before_the_model(tmp_path: Path) -> None:
    path = _write_every_kind(tmp_path)
    pid = os.getpid()
    assert path.read_text() == (
        '{"event": "start", "time": 100.0, "rank": 1, "attempt": 2, "resumed_from_step": null, '
        f'"pid": {pid}, "world_size": 4}}\n'
        '{"event": "step", "time": 101.0, "step": 1, "loss": 0.5, "loss_hex": "0x1.0000000000000p-1", '
        '"attempt": 2, "step_seconds": 0.25}\n'
        '{"event": "checkpoint", "time": 102.0, "step": 1, "attempt": 2}\n'
        '{"event": "checkpoint_failed", "time": 103.0, "step": 2, "attempt": 2, '
        '"error": "rank 0: OSError: disk full"}\n'
        '{"event": "fault", "time": 104.0, "point": "slow_step", "step": 2, "attempt": 2}\n'
        '{"event": "done", "time": 105.0, "step": 2, "attempt": 2}\n'
    )


def test_a_start_without_a_known_world_size_leaves_the_key_out(tmp_path: Path) -> None:
    path = _write_every_kind(tmp_path, world_size=None)
    start = json.loads(path.read_text().splitlines()[0])
    assert "world_size" not in start and start["resumed_from_step"] is None


def test_every_record_the_writer_writes_round_trips_through_the_model(tmp_path: Path) -> None:
    path = _write_every_kind(tmp_path)
    lines = path.read_text().splitlines()
    events = read_events(path)
    assert [type(e) for e in events] == [
        StartEvent,
        StepEvent,
        CheckpointEvent,
        CheckpointFailedEvent,
        FaultEvent,
        DoneEvent,
    ]
    assert [e.to_line() for e in events] == lines


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_loss_is_strict_json_and_read_back_exactly(
    tmp_path: Path, loss: float
) -> None:
    path = _write_every_kind(tmp_path, loss=loss)
    line = path.read_text().splitlines()[1]
    json.loads(line, parse_constant=_refuse)  # jq and JSON.parse read it: no bare NaN
    assert f'"loss": null, "loss_hex": "{loss.hex()}"' in line
    step = read_events(path)[1]
    assert isinstance(step, StepEvent) and step.loss is not None
    assert step.loss.hex() == loss.hex()
    assert step.to_line() == line


def test_an_older_writers_bare_nan_still_reads() -> None:
    step = parse_event('{"event": "step", "time": 5, "step": 3, "loss": NaN, "loss_hex": "nan"}')
    assert isinstance(step, StepEvent) and step.loss is not None and math.isnan(step.loss)


def _refuse(constant: str) -> float:
    raise AssertionError(f"bare {constant} in a JSON line")


def test_readers_ignore_unknown_keys_and_default_the_missing_ones() -> None:
    step = parse_event('{"event": "step", "time": 5, "step": 3, "loss": 1.0, "new_key": [1]}')
    assert step == StepEvent(time=5.0, step=3, loss=1.0)
    assert step.attempt == 0 and step.loss_hex is None and step.step_seconds is None
    done = parse_event('{"event": "done", "time": 7.5}')
    assert isinstance(done, DoneEvent) and done.step is None


@pytest.mark.parametrize(
    "line",
    [
        '{"event": "step", "ti',  # the torn last line of a SIGKILLed writer
        '{"event": "restart", "time": 1.0}',  # not a record of this file
        '{"event": "step"}',  # no time
        '{"event": "step", "time": 1.0, "step": "three"}',  # wrongly typed
        "[1, 2]",
    ],
)
def test_a_line_that_is_not_a_record_is_skipped_and_counted(tmp_path: Path, line: str) -> None:
    path = log_path(tmp_path, 0)
    path.write_text('{"event": "start", "time": 1.0, "rank": 0}\n\n' + line)
    log = read_rank_log(path, 0)
    assert log.events == [StartEvent(time=1.0, rank=0)]
    assert log.skipped_lines == 1
    assert read_events(path) == log.events


def test_a_missing_log_or_folder_reads_as_empty(tmp_path: Path) -> None:
    assert read_rank_log(tmp_path / "rank0.jsonl", 0) == RankLog(rank=0)
    assert read_job_logs(tmp_path / "nowhere") == {}
    with pytest.raises(OSError):
        read_events(tmp_path / "rank0.jsonl")


def test_a_rank_that_finished_after_a_requeue_is_finished(tmp_path: Path) -> None:
    """Game day 04: torchrun restarted the workers (attempt 1), then the responder requeued
    the Slurm job and a new torchrun counted from 0 again; that process finished. The
    latest process is the last ``start``, not the highest attempt."""
    for attempt, at, done in ((0, 10.0, False), (1, 20.0, False), (0, 30.0, True)):
        log = EventLog(tmp_path, rank=0, attempt=attempt, clock=lambda at=at: at, world_size=4)
        log.start(resumed_from_step=None if at == 10.0 else 20)
        log.step(step=21, loss=2.0, step_seconds=1.0)
        if done:
            log.done(step=21)
        log.close()
    ranks = read_job_logs(tmp_path)
    assert ranks[0].finished and ranks[0].done_at == 30.0
    # and one that finished before a requeue whose process has not finished is not
    again = EventLog(tmp_path, rank=0, attempt=0, clock=lambda: 40.0, world_size=4)
    again.start(resumed_from_step=21)
    again.close()
    assert not read_job_logs(tmp_path)[0].finished


def test_job_logs_answer_restarts_world_size_and_the_final_trajectory(tmp_path: Path) -> None:
    first = EventLog(tmp_path, rank=0, attempt=0, clock=lambda: 10.0, world_size=4)
    first.start(resumed_from_step=None)
    first.step(step=1, loss=2.0, step_seconds=1.0)
    first.step(step=2, loss=1.5, step_seconds=1.0)
    first.close()
    again = EventLog(tmp_path, rank=0, attempt=1, clock=lambda: 20.0, world_size=2)
    again.start(resumed_from_step=1)
    again.step(step=2, loss=1.25, step_seconds=1.0)
    again.done(step=2)
    again.close()
    (tmp_path / "rank1.jsonl").write_text("")
    (tmp_path / "notes.txt").write_text("not a rank log")

    logs = read_job_logs(tmp_path)
    assert sorted(logs) == [0, 1]
    log = logs[0]
    assert [s.resumed_from_step for s in log.starts] == [None, 1]
    assert log.finished and log.latest_attempt == 1 and log.done_at == 20.0
    assert log.last_step == StepEvent(
        time=20.0, step=2, loss=1.25, loss_hex=(1.25).hex(), attempt=1, step_seconds=1.0
    )
    assert [e.event for e in log.since_restart(15.0)] == ["start", "step", "done"]
    assert log.attempt_at(15.0) == 0
    assert current_world_size(logs, default=8) == 2
    assert current_world_size({}, default=8) == 8
    assert last_completed_step(logs) == 2
    assert final_losses(log) == {1: (2.0).hex(), 2: (1.25).hex()}


def test_the_rank_event_log_model_imports_without_torch() -> None:
    code = (
        "import sys\n"
        "import stormwatch.telemetry.events, stormwatch.telemetry.ranklogs\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
