"""End to end: the agent arms a fault point of a real trainer under torchrun, the trainer obeys.

The trainer (world size 1, a tiny model) polls ``<metrics-dir>/control/rank0.json``
once per step; the agent writes it for a ``trainer_fault``; the rank logs the
``fault`` event and counts ``stormwatch_train_fault_injections_total{point}``.
After the revert the entry is gone and the trainer keeps stepping.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from stormwatch.telemetry.events import read_events

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))


def _events(log: Path, kind: str) -> list[Any]:
    if not log.exists():
        return []
    return [event for event in read_events(log) if event.event == kind]


@pytest.mark.e2e
def test_slow_step_armed_by_the_agent_reaches_the_trainer(
    start_agent: Any, tools: Any, tmp_path: Path, metrics_dir: Path
) -> None:
    agent = start_agent(rank_scan_interval=0.2)
    job = f"ctl-{uuid.uuid4().hex[:8]}"
    logs = tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["STORMWATCH_JOB"] = job
    out = (tmp_path / "torchrun.log").open("wb")
    torchrun = subprocess.Popen(
        [
            TORCHRUN, "--standalone", "--nnodes=1", "--nproc-per-node=1", "--no-python",
            STORMWATCH, "train", "--steps", "100000", "--step-delay", "0.05",
            "--metrics-dir", str(metrics_dir), "--log-dir", str(logs), "--job", job,
            "--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--seq-len", "16",
            "--micro-batch", "2", "--quiet",
        ],
        env=env,
        stdout=out,
        stderr=out,
        start_new_session=True,
    )  # fmt: skip
    try:
        rank_log = logs / "rank0.jsonl"
        tools.wait_for(lambda: _events(rank_log, "step"), timeout=240)
        body = {
            "id": "slow-e2e",
            "kind": "trainer_fault",
            "rank": 0,
            "job": job,
            "point": "slow_step",
            "seconds": 0.05,
            "ttl_seconds": 60,
        }
        reply = tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)
        assert reply.status == 201, reply.text
        fault = tools.wait_for(lambda: _events(rank_log, "fault"), timeout=60)[0]
        assert fault.point == "slow_step"
        reply = tools.http("DELETE", agent.fault_url + "/v1/faults/slow-e2e", token=tools.token)
        assert reply.status == 200 and reply.json()["state"] == "reverted"
        assert not (metrics_dir / "control" / "rank0.json").exists()
        last = _events(rank_log, "step")[-1].step
        tools.wait_for(lambda: _events(rank_log, "step")[-1].step > last + 2, timeout=60)
    finally:
        tools.stop_process_group(torchrun)
        out.close()
