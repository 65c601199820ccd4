"""End to end with the real torchrun: the agent finds its workers and kill_rank kills one."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


@pytest.mark.e2e
def test_kill_rank_under_real_torchrun_is_restarted_and_counted(
    start_agent: Any, tools: Any, tmp_path: Path
) -> None:
    agent = start_agent(rank_scan_interval=0.5)
    job = f"e2e-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["STORMWATCH_JOB"] = job
    log = (tmp_path / "torchrun.log").open("wb")
    torchrun = subprocess.Popen(
        [
            TORCHRUN,
            "--standalone",
            "--nnodes=1",
            "--nproc-per-node=2",
            "--max-restarts=1",
            "--monitor-interval=0.1",
            "--no-python",
            "sleep",
            "120",
        ],
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:

        def ranks() -> dict[int, dict[str, Any]]:
            rows = tools.http("GET", agent.url + "/v1/ranks").json()["ranks"]
            return {row["rank"]: row for row in rows if row["job"] == job and row["alive"]}

        first = tools.wait_for(lambda: (r := ranks()) and len(r) == 2 and r, timeout=120)
        assert {row["world_size"] for row in first.values()} == {2}
        body = {"id": "e2e-kill", "kind": "kill_rank", "rank": 1, "job": job, "signal": "SIGKILL"}
        reply = tools.http("POST", agent.fault_url + "/v1/faults", body=body, token=tools.token)
        assert reply.status == 201, reply.text
        assert reply.json()["target_pid"] == first[1]["pid"]
        # torchrun restarts the worker group: new pids, attempt 1.
        restarted = tools.wait_for(
            lambda: (r := ranks()) and len(r) == 2 and r[1]["pid"] != first[1]["pid"] and r,
            timeout=120,
        )
        assert restarted[1]["restart_count"] == 1
        scrape = tools.scrape(agent.url)
        assert (
            scrape.value("stormwatch_rank_unexpected_exits_total", training_job=job, rank="1") >= 1
        )
        assert scrape.value("stormwatch_rank_up", training_job=job, rank="1") == 1
    finally:
        tools.stop_process_group(torchrun)
        log.close()
