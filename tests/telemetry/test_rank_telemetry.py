"""Per-rank telemetry: multiprocess metric files, the event log, the done marker, failure isolation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from stormwatch.telemetry.events import StartEvent, read_events
from stormwatch.telemetry.metrics import CATALOGUE
from stormwatch.telemetry.rank import RankTelemetry
from stormwatch.trainer.config import TelemetryConfig

_RANK_PROCESS = """
import os, sys
from pathlib import Path
from stormwatch.telemetry.rank import RankTelemetry
from stormwatch.trainer.config import TelemetryConfig

metrics_dir, log_dir, rank, finish = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
# Started without PROMETHEUS_MULTIPROC_DIR: RankTelemetry must set up multiprocess mode itself.
assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
telemetry = RankTelemetry(
    TelemetryConfig(job="unit", metrics_dir=Path(metrics_dir), log_dir=Path(log_dir)),
    rank=rank, world_size=4, attempt=1,
)
telemetry.start(resumed_from_step=None)
for step in (1, 2):
    telemetry.on_issue("all_gather", 1024)
    telemetry.on_complete("all_gather", 0.25)
    telemetry.step(step=step, loss=1.0 / step, seconds=0.5, tokens=256)
telemetry.checkpoint(step=2)
if finish:
    telemetry.done(step=2)
telemetry.close()
assert not telemetry.errors, telemetry.errors
print(os.getpid())
"""


def _python(script: str, *args: str) -> str:
    """Run ``script`` in a fresh interpreter without PROMETHEUS_MULTIPROC_DIR (the telemetry
    must set multiprocess mode up itself); its stdout, after it exited 0."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _run_rank(metrics_dir: Path, log_dir: Path, rank: int, *, finish: bool) -> int:
    """A stand-in rank process reporting two steps; returns its pid after it exited."""
    out = _python(_RANK_PROCESS, str(metrics_dir), str(log_dir), str(rank), "1" if finish else "0")
    return int(out.strip())


def _samples(metrics_dir: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    out = {}
    for family in registry.collect():
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def test_fc01_dead_rank_gauges_disappear(tmp_path):
    metrics, logs = tmp_path / "metrics", tmp_path / "logs"
    dead_pid = _run_rank(metrics, logs, rank=1, finish=False)
    _run_rank(metrics, logs, rank=0, finish=True)

    before = _samples(metrics)
    assert _value(before, "stormwatch_train_step", training_job="unit", rank="1") == 2
    assert _value(before, "stormwatch_train_node_restarts", training_job="unit", rank="1") == 1
    assert _value(before, "stormwatch_train_job_restarts", training_job="unit", rank="1") == 1

    mark_process_dead(dead_pid, path=str(metrics))
    after = _samples(metrics)
    gauges = [spec.name for spec in CATALOGUE if spec.kind == "gauge"]
    for name in gauges:  # every state gauge of the dead rank is gone, no pid label appears
        assert _value(after, name, training_job="unit", rank="1") is None, name
        assert not any(key[0] == name and ("pid", str(dead_pid)) in key[1] for key in after)
    assert (
        _value(after, "stormwatch_train_step", training_job="unit", rank="0") == 2
    )  # live rank kept
    # counters and histograms stay
    assert _value(after, "stormwatch_train_steps_total", training_job="unit", rank="1") == 2
    assert _value(after, "stormwatch_train_tokens_total", training_job="unit", rank="1") == 512
    assert (
        _value(
            after,
            "stormwatch_collective_calls_total",
            training_job="unit",
            rank="1",
            op="all_gather",
        )
        == 2
    )
    assert (
        _value(
            after,
            "stormwatch_collective_bytes_total",
            training_job="unit",
            rank="1",
            op="all_gather",
        )
        == 2048
    )
    assert (
        _value(
            after,
            "stormwatch_collective_duration_seconds_total",
            training_job="unit",
            rank="1",
            op="all_gather",
        )
        == 0.5
    )
    assert (
        _value(after, "stormwatch_train_step_duration_seconds_count", training_job="unit", rank="1")
        == 2
    )


def test_event_log_and_done_marker_follow_the_contract(tmp_path):
    metrics, logs = tmp_path / "metrics", tmp_path / "logs"
    (metrics).mkdir()
    (metrics / "rank3.done").touch()  # stale marker from an earlier run
    pid = _run_rank(metrics, logs, rank=3, finish=False)
    assert not (metrics / "rank3.done").exists()
    _run_rank(metrics, logs, rank=3, finish=True)
    assert (metrics / "rank3.done").exists()

    path = logs / "rank3.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]  # the file's keys
    assert [e["event"] for e in events] == ["start", "step", "step", "checkpoint"] * 2 + ["done"]
    start = events[0]
    assert set(start) == {
        "event",
        "time",
        "rank",
        "attempt",
        "resumed_from_step",
        "pid",
        "world_size",
    }
    assert (start["rank"], start["attempt"], start["resumed_from_step"], start["pid"]) == (
        3,
        1,
        None,
        pid,
    )
    assert start["world_size"] == 4  # the world_size the rank was started with
    step = events[2]
    assert set(step) == {"event", "time", "step", "loss", "loss_hex", "attempt", "step_seconds"}
    assert step["loss"] == 0.5 and float.fromhex(step["loss_hex"]) == 0.5
    assert set(events[3]) == {"event", "time", "step", "attempt"}
    assert set(events[-1]) == {"event", "time", "step", "attempt"}
    # Every reader parses the lines with the writer's models, which keep every key.
    assert [json.loads(e.to_line()) for e in read_events(path)] == events


def test_torn_last_line_is_skipped_when_reading(tmp_path):
    path = tmp_path / "rank0.jsonl"
    path.write_text(json.dumps({"event": "start", "time": 1.0}) + "\n" + '{"event": "st')
    assert read_events(path) == [StartEvent(time=1.0)]


def test_failing_event_log_never_raises_into_training(tmp_path, caplog):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    telemetry = RankTelemetry(
        TelemetryConfig(job="unit", log_dir=not_a_dir / "logs"), rank=0, world_size=1, attempt=0
    )
    telemetry.start(resumed_from_step=None)
    telemetry.step(step=1, loss=1.0, seconds=0.1, tokens=1)
    telemetry.done(step=1)
    telemetry.close()
    assert telemetry.errors["events"] == 1  # the log could not be opened; later calls are no-ops
    assert "telemetry sink events failed" in caplog.text


_LATE_PROGRESS = """
import sys
from pathlib import Path
from stormwatch.telemetry.rank import RankTelemetry
from stormwatch.trainer.config import TelemetryConfig

now = [1000.0]
telemetry = RankTelemetry(
    TelemetryConfig(job="unit", metrics_dir=Path(sys.argv[1]), log_dir=None),
    rank=0, world_size=1, attempt=0, clock=lambda: now[0],
)
telemetry.progress()  # 1000
now[0] = 1030.0
telemetry.on_complete("all_reduce", 0.1, 29.0)  # completed at 1001, noticed at 1030
now[0] = 1031.0
telemetry.on_complete("all_reduce", 0.1, 60.0)  # completed before the heartbeat: no change
assert not telemetry.errors, telemetry.errors
"""


def test_fc10_a_completion_noticed_late_moves_the_heartbeat_only_to_its_completion(tmp_path):
    _python(_LATE_PROGRESS, str(tmp_path))
    samples = _samples(tmp_path)
    heartbeat = [
        v for (name, _), v in samples.items()
        if name == "stormwatch_train_last_progress_timestamp_seconds"
    ]  # fmt: skip
    assert heartbeat == [1001.0], samples
