"""A 2-rank gloo job under real torchrun that uses only the public telemetry API gives the
node agent what it reads from the reference trainer: per-rank heartbeats and steps,
collective counts, the phase deadline, the event log and the done markers, read with the
agent's own reader (:class:`stormwatch.agent.watch.trainer_files.TrainerFiles`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stormwatch.agent.watch.trainer_files import (
    CALLS_SAMPLE,
    COMPUTE_METRIC,
    COUNTERS,
    HEARTBEAT_METRIC,
    LIVE_GAUGES,
    PHASE_DEADLINE_METRIC,
    PROGRESS_METRIC,
    STEP_METRIC,
    WAIT_METRIC,
    TrainerFiles,
    add,
)
from stormwatch.telemetry.events import CheckpointEvent, DoneEvent, StartEvent, StepEvent
from stormwatch.telemetry.ranklogs import read_job_logs

pytestmark = [pytest.mark.e2e, pytest.mark.untimed]

JOB = """
import time
import torch
import torch.distributed as dist
import stormwatch.telemetry as swt

swt.init()  # before the process group: collectives are counted once it exists
dist.init_process_group("gloo")
with swt.phase("checkpoint_load"):
    time.sleep(0.05)
for step in range(1, 6):
    t = torch.ones(256)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    swt.step(step, loss=float(t[0]) / step, tokens=256)
    if step == 3:
        with swt.phase("checkpoint_save"):
            dist.barrier()
        swt.checkpoint(3)
with swt.phase("eval"):
    swt.session().dump("inside the eval phase")  # a post-mortem dump, on demand
    time.sleep(600)  # killed here by the test once it has read the deadline
"""


def test_a_torchrun_job_on_the_public_api_gives_the_agent_its_metrics(tmp_path: Path) -> None:
    script = tmp_path / "train_api.py"
    script.write_text(textwrap.dedent(JOB))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    env.update(
        OMP_NUM_THREADS="1",
        STORMWATCH_JOB="api-e2e",
        STORMWATCH_METRICS_DIR=str(tmp_path / "metrics"),
        STORMWATCH_LOG_DIR=str(tmp_path / "logs"),
        STORMWATCH_DUMP_DIR=str(tmp_path / "dumps"),
        STORMWATCH_PHASE_BOUNDS="eval=77",
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(script)]  # fmt: skip
    files = TrainerFiles(tmp_path / "metrics", reader="test")
    names = (HEARTBEAT_METRIC, PROGRESS_METRIC, STEP_METRIC, COMPUTE_METRIC, WAIT_METRIC,
             PHASE_DEADLINE_METRIC)  # fmt: skip
    with subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as torchrun:  # fmt: skip
        deadline = time.monotonic() + 120
        gauges = files.read(LIVE_GAUGES, names)
        while len(list((tmp_path / "dumps").glob("rank*.json"))) < 2:
            assert torchrun.poll() is None, torchrun.communicate()[0]
            assert time.monotonic() < deadline, "the ranks never reached their eval phase"
            time.sleep(0.2)
        read_at = time.time()
        gauges = files.read(LIVE_GAUGES, names)
        torchrun.terminate()  # torchrun stops its workers with SIGTERM
        output = torchrun.communicate(timeout=60)[0]

    ranks = {("api-e2e", 0), ("api-e2e", 1)}
    assert set(gauges[STEP_METRIC]) == ranks, output
    assert all(v == 5 for v in gauges[STEP_METRIC].values())
    for key in ranks:
        assert 0 < gauges[HEARTBEAT_METRIC][key] <= gauges[PROGRESS_METRIC][key] <= read_at
        assert gauges[COMPUTE_METRIC][key] >= 0 and gauges[WAIT_METRIC][key] >= 0
        # inside eval: entry + the job's bound of 77 s
        assert read_at < gauges[PHASE_DEADLINE_METRIC][key] <= read_at + 77
    calls = files.read(COUNTERS, (CALLS_SAMPLE,), combine=add)[CALLS_SAMPLE]
    # 5 steps x (all_reduce + broadcast) + the barrier of step 3, the same on both ranks
    assert calls == {key: 11.0 for key in ranks}, calls

    logs = read_job_logs(tmp_path / "logs")
    assert sorted(logs) == [0, 1]
    for rank, log in logs.items():
        kinds = [type(e) for e in log.events]
        assert kinds[0] is StartEvent and log.starts[0].world_size == 2
        assert [e.step for e in log.steps] == [1, 2, 3, 4, 5]
        assert [e.step for e in log.events if isinstance(e, CheckpointEvent)] == [3]
        assert all(isinstance(e, StepEvent) and e.loss_hex for e in log.steps)
        assert not any(isinstance(e, DoneEvent) for e in log.events)  # stopped by SIGTERM
        assert not (tmp_path / "metrics" / f"rank{rank}.done").exists()
