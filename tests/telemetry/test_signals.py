"""SIGTERM to a process using the telemetry API: the session writes its post-mortem dump
(the flush) and hands the signal on to the handler that was there before (real processes,
real signals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stormwatch.telemetry.dump import rank_dump_paths
from stormwatch.telemetry.lifecycle.sigterm import MAIN_THREAD_GRACE_S

JOB = """
import signal, sys, time
import stormwatch.telemetry as swt
{previous}
swt.init()
swt.step(1, loss=0.5)
print("ready", flush=True)
for step in range(2, 10_000):
    time.sleep(0.01)
    swt.step(step)
"""


def start(tmp_path: Path, previous: str) -> subprocess.Popen[str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STORMWATCH_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_"))
    }
    environ.update(
        RANK="1",
        LOCAL_RANK="1",
        WORLD_SIZE="2",
        STORMWATCH_METRICS_DIR=str(tmp_path / "metrics"),
        STORMWATCH_LOG_DIR=str(tmp_path / "logs"),
        STORMWATCH_DUMP_DIR=str(tmp_path / "dumps"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", JOB.format(previous=textwrap.dedent(previous))],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_sigterm_writes_the_dump_then_chains_to_the_previous_handler(tmp_path: Path) -> None:
    previous = """
    def handler(signum, frame):
        print("previous handler ran", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, handler)
    """
    proc = start(tmp_path, previous)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "previous handler ran" in out
    [path] = rank_dump_paths(tmp_path / "dumps", 1)
    dump = json.loads(path.read_text())
    assert dump["rank"] == 1 and dump["reason"].startswith("signal SIGTERM ("), dump["reason"]
    assert dump["step"] >= 2  # the step in progress
    # sys.exit(143) is not a clean end: no done record, no done marker
    lines = (tmp_path / "logs" / "rank1.jsonl").read_text().splitlines()
    events = [json.loads(line)["event"] for line in lines]
    assert events[0] == "start" and "done" not in events
    assert not (tmp_path / "metrics" / "rank1.done").exists()


def test_issue18_sigterm_marks_a_stop_request_for_the_agent_and_the_rules(tmp_path: Path) -> None:
    """At SIGTERM the rank touches ``rank<R>.stopping`` (the agent then counts its exit as a
    stop, not a failure) and enters the ``stopping`` phase for its bound (120 s), so its
    last seconds without progress are not a stall."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    previous = """
    def handler(signum, frame):
        time.sleep(0.3)  # a job's own cleanup: the phase is set from a thread meanwhile
        sys.exit(143)
    signal.signal(signal.SIGTERM, handler)
    """
    proc = start(tmp_path, previous)
    signalled = time.time()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    marker = tmp_path / "metrics" / "rank1.stopping"
    assert marker.exists() and marker.stat().st_mtime >= signalled - 1.0
    assert marker.read_text().strip() == str(proc.pid)  # the agent matches it to the process
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path / "metrics"))
    deadline = registry.get_sample_value(
        "stormwatch_train_phase_deadline_timestamp_seconds",
        {"training_job": "default", "rank": "1", "phase": "stopping"},
    ) or max(
        (
            sample.value
            for metric in registry.collect()
            for sample in metric.samples
            if sample.name == "stormwatch_train_phase_deadline_timestamp_seconds"
            and sample.labels.get("phase") == "stopping"
        ),
        default=None,
    )
    assert deadline is not None, "no stopping phase exported"
    assert signalled + 110 <= deadline <= time.time() + 121


def test_sigterm_with_the_default_handler_still_ends_the_process_by_the_signal(
    tmp_path: Path,
) -> None:
    proc = start(tmp_path, previous="")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err
    assert rank_dump_paths(tmp_path / "dumps", 1)
    assert not (tmp_path / "metrics" / "rank1.done").exists()


def test_an_ignored_sigterm_stays_ignored(tmp_path: Path) -> None:
    proc = start(tmp_path, previous="signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    try:
        proc.send_signal(signal.SIGTERM)
        for _ in range(200):
            if rank_dump_paths(tmp_path / "dumps", 1):
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert rank_dump_paths(tmp_path / "dumps", 1)
        assert proc.poll() is None  # still training
    finally:
        proc.kill()
        proc.communicate(timeout=60)


def test_a_clean_exit_writes_the_done_marker_by_itself(tmp_path: Path) -> None:
    code = "import stormwatch.telemetry as swt\nswt.init()\nswt.step(1)\n"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STORMWATCH_")}
    environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", STORMWATCH_METRICS_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=environ, timeout=60, check=False)
    assert done.returncode == 0
    assert (tmp_path / "rank0.done").exists()
    unhandled = subprocess.run(
        [sys.executable, "-c", code + "raise ValueError('boom')\n"],
        env={**environ, "RANK": "1", "WORLD_SIZE": "2"},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert unhandled.returncode == 1
    assert not (tmp_path / "rank1.done").exists()  # an unhandled exception is no clean end


#: Rank 0 waits in an all-reduce that rank 1 never joins: its main thread is in gloo's C++.
WAITING = """
import os, sys, time
import signal
import torch, torch.distributed as dist
import stormwatch.telemetry as swt
rank = int(os.environ["RANK"])
if os.environ.get("TRAINER_HANDLER"):  # the trainer's own handler, there before init()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
own = bool(os.environ.get("OWN_SIGNALS"))  # the reference trainer's way: no API handler
swt.init(handle_signals=not own)
if own:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"],
                        rank=rank, world_size=2)
print("ready", flush=True)
if rank == 0:
    dist.all_reduce(torch.ones(4))  # never completes
time.sleep(600)
"""


@pytest.mark.parametrize(
    "trainer_handler", [False, True, "own"], ids=["default", "trainer", "own-signals"]
)
def test_a_rank_waiting_inside_a_collective_dumps_and_dies_at_sigterm(
    tmp_path: Path, trainer_handler: bool | str
) -> None:
    """The dump comes from the thread; where the chain ends at the default action the
    process then ends with 143 (as without stormwatch), unclean; a trainer's handler is
    left to run (the process waits as it would without stormwatch). Either way, and for a
    job that handles SIGTERM itself (``init(handle_signals=False)``, the reference
    trainer: no dump, its handler cannot run), the stop marker is written at once: the
    agent counts the SIGKILL that follows as a stop (game day 14-node-cut-off: node 0's
    ranks, waiting on node 1's, were named as failures)."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STORMWATCH_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_"))
    }
    base.update(
        WORLD_SIZE="2",
        PORT=str(port),
        STORMWATCH_DUMP_DIR=str(tmp_path / "dumps"),
        STORMWATCH_METRICS_DIR=str(tmp_path / "metrics"),
    )
    if trainer_handler:
        base["OWN_SIGNALS" if trainer_handler == "own" else "TRAINER_HANDLER"] = "1"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", WAITING],
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        for rank in ranks:
            assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # rank 0 is inside the all-reduce by now
        ranks[0].send_signal(signal.SIGTERM)  # no Python handler runs while it waits
        marker = tmp_path / "metrics" / "rank0.stopping"
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.read_text().strip() == str(ranks[0].pid)
        if trainer_handler == "own":
            time.sleep(MAIN_THREAD_GRACE_S + 1.0)
            assert ranks[0].poll() is None  # its handler is left to run; nothing ends it
            assert not rank_dump_paths(tmp_path / "dumps", 0)
            return
        while not rank_dump_paths(tmp_path / "dumps", 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        [dump] = rank_dump_paths(tmp_path / "dumps", 0)
        reason = json.loads(dump.read_text())["reason"]
        assert reason == "signal SIGTERM (written from a thread at once)", reason
        if trainer_handler:
            time.sleep(MAIN_THREAD_GRACE_S + 1.0)
            assert ranks[0].poll() is None  # the trainer's handler is left to run
        else:
            assert ranks[0].wait(timeout=MAIN_THREAD_GRACE_S + 5) == 128 + signal.SIGTERM
            assert not (tmp_path / "metrics" / "rank0.done").exists()
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
            if rank.stdout is not None:
                rank.stdout.close()
