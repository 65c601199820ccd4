"""Telemetry off the training thread (issue 20): per step and per collective nothing writes
a file, encodes JSON or reads /proc on the thread that trains; the flusher writes it all,
with the same metric values, within its interval; nothing is lost at exit or SIGTERM.

Each case runs in a fresh interpreter: prometheus-client's multiprocess mode is
process-wide."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from stormwatch.telemetry.events import read_events


def _python(code: str, *args: str, expect: int = 0) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STORMWATCH_", "PROMETHEUS_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == expect, done.stderr
    return done.stdout


def _samples(metrics_dir: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


_STEPS_ON_A_WATCHED_THREAD = """
import json, sys, threading, time
from pathlib import Path

import psutil
from prometheus_client import mmap_dict

import stormwatch.telemetry.events as events
from stormwatch.telemetry.lifecycle.launch import Placement, Settings
from stormwatch.telemetry.lifecycle.session import Session
from stormwatch.telemetry.lifecycle.steps import StepRecord

tmp = Path(sys.argv[1])
seen = {"metric_write": set(), "json": set(), "log_write": set(), "proc_read": set()}

def on(kind, fn):
    def wrapper(*args, **kwargs):
        seen[kind].add(threading.current_thread().name)
        return fn(*args, **kwargs)
    return wrapper

mmap_dict.MmapedDict.write_value = on("metric_write", mmap_dict.MmapedDict.write_value)
events._Record.to_line = on("json", events._Record.to_line)
psutil.Process = on("proc_read", psutil.Process)

session = Session(
    Settings(job="hot", metrics_dir=tmp / "metrics", log_dir=tmp / "logs",
             collectives=False, handle_signals=False),
    Placement(),
)
session.start()
log = session._telemetry._events
log._file.write = on("log_write", log._file.write)
telemetry = session._telemetry
for name in seen:
    seen[name].clear()
threading.current_thread().name = "training"
for step in range(1, 6):
    for _ in range(21):  # the reference trainer's collectives per step, as its counter reports them
        telemetry.on_issue("all_reduce", 64)
        telemetry.on_complete("all_reduce", 0.001)
    session.step(step, loss=1.0, tokens=64, samples=2, lr=0.1, grad_norm=0.5)
    session.record_step(StepRecord(step=step, seconds=0.1, loss=1.0, tokens=64,
                                   wait_seconds=0.01, mfu=0.3, peak_flops=1e12, sample_rss=True))
time.sleep(0.5)  # the flusher's turn
on_training = {kind: "training" in threads for kind, threads in seen.items()}
written = {kind: bool(threads) for kind, threads in seen.items()}
session.shutdown()
print(json.dumps({"on_training": on_training, "written": written}))
"""


def test_steps_and_collectives_do_no_io_json_or_proc_read_on_the_training_thread(
    tmp_path: Path,
) -> None:
    out = json.loads(_python(_STEPS_ON_A_WATCHED_THREAD, str(tmp_path)))
    assert out["on_training"] == {
        "metric_write": False,
        "json": False,
        "log_write": False,
        "proc_read": False,
    }
    # ... and the flusher did all of it, within half a second, with no further call
    assert out["written"] == dict.fromkeys(out["written"], True)
    samples = _samples(tmp_path / "metrics")
    labels = (("rank", "0"), ("training_job", "hot"))
    assert samples["stormwatch_train_steps_total", labels] == 10
    calls = (("op", "all_reduce"), *labels)
    assert samples["stormwatch_collective_calls_total", calls] == 105
    assert samples["stormwatch_train_memory_bytes", (("kind", "rss"), *labels)] > 0


_ONE_BY_ONE_AND_BATCHED = """
import math, sys
from pathlib import Path
from stormwatch.telemetry.metrics import RankMetrics

folder = Path(sys.argv[1])
now = RankMetrics(folder, job="now", rank=0)
batched = RankMetrics(folder, job="batched", rank=0, deferred=True)
# flushed after every step: what did not change since the last flush is not written again
each = RankMetrics(folder, job="each", rank=0, deferred=True)
values = [0.0, 1e-5, 3e-5, 1e-4, 0.25, 0.5, 1.0, 119.0, 120.0, 500.0, -1.0, math.nan]
for metrics in (now, batched, each):
    metrics.job_info(world_size=4, node_restarts=1)
    for i, seconds in enumerate(values):
        metrics.step(step=i, loss=1.0 / (i + 1), seconds=abs(seconds) + 0.001, tokens=64,
                     timestamp=1000.0 + i)
        metrics.collective_issued("all_gather", 1024 * i)
        metrics.collective_completed("all_gather", seconds)
        metrics.collective(mesh_dim="dp_shard", op="all_gather", size=2048, seconds=seconds)
        metrics.bandwidth(mesh_dim="tp", op="all_reduce", algbw=1e9 + i, busbw=2e9 + i)
        metrics.breakdown(compute_seconds=0.01 * i, wait_seconds=0.001 * i)
        metrics.memory(kind="rss", nbytes=1000 + i)
        metrics.samples(3)
        metrics.learning_rate(0.1 if i % 3 else 0.2)  # repeats, and returns to a value
        metrics.phase("eval", deadline=2000.0 + i)
        metrics.fault("slow_step")
        metrics.telemetry_error("events", 2)
        metrics.samples(0)
        if metrics is each:
            metrics.flush()
    metrics.checkpoint_interval(10)
assert batched.pending
batched.flush()
each.flush()
assert not batched.pending and not each.pending
"""


def test_metrics_written_in_a_batch_equal_the_same_updates_one_by_one(tmp_path: Path) -> None:
    _python(_ONE_BY_ONE_AND_BATCHED, str(tmp_path))
    by_job: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for (name, labels), value in _samples(tmp_path).items():
        job = dict(labels)["training_job"]
        rest = tuple(item for item in labels if item[0] != "training_job")
        by_job.setdefault(job, {})[name, rest] = value
    now = by_job["now"]
    assert any(name.endswith("_bucket") for name, _ in now)
    for job in ("batched", "each"):
        assert now.keys() == by_job[job].keys(), job
        for key, value in now.items():
            assert by_job[job][key] == pytest.approx(value, rel=1e-12, nan_ok=True), (job, key)


_HEARTBEAT = """
import sys, time
from pathlib import Path
from stormwatch.telemetry.rank import RankTelemetry
from stormwatch.trainer.config import TelemetryConfig

now = [1000.0]
telemetry = RankTelemetry(
    TelemetryConfig(job="beat", metrics_dir=Path(sys.argv[1]), log_dir=None),
    rank=0, world_size=1, attempt=0, clock=lambda: now[0],
)
telemetry.step(step=1, loss=1.0, seconds=0.1, tokens=1)  # progress at 1000, recorded only
now[0] = 1060.0  # a minute later the rank still hangs: no progress recorded since
time.sleep(float(sys.argv[2]))
print("ok")
"""


@pytest.mark.parametrize("wait", [0.3, 1.2])
def test_the_heartbeat_reaches_the_file_within_the_interval_and_never_moves_by_itself(
    tmp_path: Path, wait: float
) -> None:
    code = _HEARTBEAT.replace('print("ok")', _READ_HEARTBEAT)
    out = _python(code, str(tmp_path), str(wait))
    assert json.loads(out) == [1000.0]  # the step's time, not the flusher's clock


_READ_HEARTBEAT = """
import json
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
registry = CollectorRegistry()
MultiProcessCollector(registry, path=sys.argv[1])
print(json.dumps([s.value for f in registry.collect() for s in f.samples
                  if s.name == "stormwatch_train_last_progress_timestamp_seconds"]))
import os; os._exit(0)  # no exit hook: what a reader sees while the rank runs
"""


_SIGTERM = """
import os, signal, sys
import stormwatch.telemetry as swt

swt.init(flight_recorder=False)  # handles SIGTERM; the default action ends the process
for step in range(1, 201):
    swt.step(step, loss=1.0, tokens=8)
os.kill(os.getpid(), signal.SIGTERM)  # no exit hook runs after the default action
signal.pause()
"""


def test_a_sigterm_right_after_the_steps_loses_no_record_or_metric(tmp_path: Path) -> None:
    env_code = (
        "import os\n"
        f"os.environ.update(STORMWATCH_METRICS_DIR={str(tmp_path / 'metrics')!r}, "
        f"STORMWATCH_LOG_DIR={str(tmp_path / 'logs')!r}, STORMWATCH_JOB='term', "
        "RANK='0', WORLD_SIZE='1', LOCAL_RANK='0')\n"
    )
    _python(env_code + textwrap.dedent(_SIGTERM), expect=-signal.SIGTERM)
    steps = [e.step for e in read_events(tmp_path / "logs" / "rank0.jsonl") if e.event == "step"]
    assert steps == list(range(1, 201))
    samples = _samples(tmp_path / "metrics")
    labels = (("rank", "0"), ("training_job", "term"))
    assert samples["stormwatch_train_steps_total", labels] == 200
    assert samples["stormwatch_train_step", labels] == 200
    assert samples["stormwatch_train_tokens_total", labels] == 1600


_FULL_QUEUE = """
import sys
from pathlib import Path
import stormwatch.telemetry.events as events
from stormwatch.telemetry.rank import RankTelemetry
from stormwatch.trainer.config import TelemetryConfig

events.MAX_PENDING = 5
folder = Path(sys.argv[1])
telemetry = RankTelemetry(
    TelemetryConfig(job="full", metrics_dir=folder / "metrics", log_dir=folder / "logs"),
    rank=0, world_size=1, attempt=0,
)
telemetry._flusher.stop()  # a writer that does not keep up: nothing drains the queue
for step in range(1, 9):
    telemetry.step(step=step, loss=1.0, seconds=0.1, tokens=1)
telemetry.close()
print(telemetry.errors["events"])
"""


def test_a_full_event_queue_drops_step_records_and_counts_them(tmp_path: Path) -> None:
    assert _python(_FULL_QUEUE, str(tmp_path)).strip() == "3"
    steps = [e.step for e in read_events(tmp_path / "logs" / "rank0.jsonl") if e.event == "step"]
    assert steps == [1, 2, 3, 4, 5]
    errors = _samples(tmp_path / "metrics")[
        "stormwatch_train_telemetry_errors_total",
        (("rank", "0"), ("sink", "events"), ("training_job", "full")),
    ]
    assert errors == 3


def test_a_flush_on_sigterm_waits_for_the_round_in_progress() -> None:
    """CI cc18: the flusher's own round had taken the records and was writing them when
    the SIGTERM's round began; that one found nothing left, returned at once, and the
    default action ended the process mid-write (a 0-byte counter file, lost totals)."""
    import threading
    import time

    from stormwatch.telemetry.handoff.flusher import Flusher

    pending, written = list(range(50)), []
    writing = threading.Event()

    def flush() -> None:
        taken = pending[:]
        del pending[:]
        if taken:
            writing.set()
            time.sleep(0.3)  # a slow write of what this round took
        written.extend(taken)

    errors: list[BaseException] = []
    flusher = Flusher([("metrics", flush)], on_error=lambda _s, e: errors.append(e), interval=0.01)
    flusher.start()
    try:
        assert writing.wait(5)
        assert flusher.flush_within(2.0)
        assert written == list(range(50)) and errors == []
    finally:
        flusher.stop()


def test_a_round_inside_a_round_on_the_same_thread_goes_ahead() -> None:
    """A signal handler (or what it chains to) flushing on the thread it interrupted
    mid-round must not deadlock on the round lock."""
    from stormwatch.telemetry.handoff.flusher import Flusher

    calls: list[str] = []
    flusher: Flusher

    def flush() -> None:
        calls.append("round")
        if len(calls) == 1:
            flusher.flush()  # as a handler interrupting this round would

    flusher = Flusher([("metrics", flush)], on_error=lambda _s, _e: None)
    flusher.flush()
    assert calls == ["round", "round"]
