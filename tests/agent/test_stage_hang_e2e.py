"""No blind spot before the first step: a rank stuck in each start-up stage is found hung by
the agent within that stage's bound, and named by the stage (issue 17).

Real torchrun, two gloo ranks of the reference trainer, the real agent in-process. Rank 1's
control file arms ``stage_hang`` at every start-up stage: ``rendezvous`` (before its
process group exists), ``mesh``, ``parallelize`` and ``checkpoint_load``; each stage's
bound is 2 s (``STORMWATCH_PHASE_BOUNDS``). For each stage in turn the test waits for the
agent's ``rank_hang`` event of rank 1 naming it, checks it came after the deadline and
within the detection budget of it, then removes that entry (a chaos revert), so the rank
moves on to the next stage; at the end the job trains its step and exits cleanly. Before
the start-up stages were marked, a rank had no heartbeat before its first step and the
agent never called it hung.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from stormwatch.faults.control_file import ENTRY, control_path, disarm, write_entries

pytestmark = pytest.mark.e2e

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
STAGES = ("rendezvous", "mesh", "parallelize", "checkpoint_load")
BOUND_SECONDS = 2.0
#: From a stage's deadline to the agent's event: a scan (0.1 s), the rank's gauges read,
#: scheduling on a loaded 2-core box.
DETECTION_BUDGET = 3.0
HUNG_RANK = 1


def _stormwatch() -> str:
    return str(Path(sys.executable).with_name("stormwatch"))


def test_a_rank_stuck_in_each_start_up_stage_is_found_within_its_bound_and_named_by_it(
    start_agent: Any, tools: Any, tmp_path: Path, metrics_dir: Path
) -> None:
    agent = start_agent(hang_floor_seconds=1.0, hang_warmup_seconds=1.0)  # no step yet: warm-up
    job = f"stages-{uuid.uuid4().hex[:8]}"
    control = control_path(metrics_dir / "control", HUNG_RANK)
    entries = {s: ENTRY.validate_python({"point": "stage_hang", "stage": s}) for s in STAGES}
    write_entries(control, list(entries.values()))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORMWATCH_", "PROMETHEUS_"))}
    env.update(
        OMP_NUM_THREADS="1",
        STORMWATCH_JOB=job,
        STORMWATCH_PHASE_BOUNDS=",".join(f"{s}={BOUND_SECONDS:g}" for s in STAGES),
    )
    log = (tmp_path / "torchrun.log").open("wb")
    torchrun = subprocess.Popen(
        [
            TORCHRUN, "--standalone", "--nnodes=1", "--nproc-per-node=2", "--no-python",
            _stormwatch(), "train", "--dp", "2", "--steps", "1", "--n-layers", "1", "--quiet",
            "--job", job, "--metrics-dir", str(metrics_dir),
            "--log-dir", str(tmp_path / "logs"), "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--collective-timeout", "60",
        ],
        env=env, stdout=log, stderr=log, cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    try:
        for stage in STAGES:

            def hang_named(stage: str = stage) -> Any:
                events = tools.http("GET", agent.url + f"/v1/events?job={job}&kind=rank_hang")
                return next(
                    (
                        e
                        for e in events.json()["events"]
                        if e["rank"] == HUNG_RANK and e.get("phase") == stage
                    ),
                    None,
                )

            event = tools.wait_for(hang_named, timeout=90 if stage == "rendezvous" else 30)
            entered, deadline = event["heartbeat"], event["phase_deadline"]
            late = event["time"] - deadline
            print(f"{stage}: found {late:.2f} s after its deadline")
            assert deadline - entered == pytest.approx(BOUND_SECONDS, abs=0.05)
            assert 0 <= late <= DETECTION_BUDGET, event
            disarm(control, entries[stage])  # the rank moves on to the next stage
        assert torchrun.wait(timeout=60) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    finally:
        if torchrun.poll() is None:
            tools.stop_process_group(torchrun)
        log.close()
    events = tools.http("GET", agent.url + f"/v1/events?job={job}").json()["events"]
    cleared = [e for e in events if e["kind"] == "rank_hang_cleared" and e["rank"] == HUNG_RANK]
    assert len(cleared) >= len(STAGES) - 1  # each stage's hang ended when the rank moved on
