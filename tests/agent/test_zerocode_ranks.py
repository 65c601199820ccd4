"""Ranks of a zero-code job started by srun with no torchrun in between
(``srun ... stormwatch run -- python train.py``): the agent finds the Slurm tasks that
``stormwatch run`` marked, under their step daemon, and reports their exits as torchrun
workers'. Real processes: a process named ``slurmstepd`` stands in for Slurm's step daemon
(no slurmd here) and starts the real ``stormwatch run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

from stormwatch.contracts.rank_env import is_rank_launcher, rank_env

STORMWATCH = str(Path(sys.executable).with_name("stormwatch"))

#: A Slurm task: waits for ``<dir>/exit<R>``, touches its done marker as the telemetry API
#: does at any exit without an unhandled exception, then exits with the code written there.
TASK = textwrap.dedent(
    """
    import os, pathlib, sys, time
    path = os.path.join(sys.argv[1], "exit" + os.environ["SLURM_PROCID"])
    parent = os.getppid()
    while not os.path.exists(path):
        if os.getppid() != parent:
            sys.exit(1)  # the step daemon is gone
        time.sleep(0.05)
    pathlib.Path(os.environ["STORMWATCH_METRICS_DIR"], "rank" + os.environ["SLURM_PROCID"] + ".done").touch()
    time.sleep(0.1)
    sys.exit(int(open(path).read()))
    """
)

#: A step daemon: starts one task per rank with srun's environment, reaps them, exits.
STEPD = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    spec = json.loads(sys.argv[1])
    tasks = []
    for rank in range(spec["ntasks"]):
        env = dict(os.environ, SLURM_JOB_ID="41", SLURM_STEP_ID="0", SLURM_PROCID=str(rank),
                   SLURM_LOCALID=str(rank), SLURM_NTASKS=str(spec["ntasks"]),
                   SLURM_JOB_NAME=spec["job"])
        tasks.append(subprocess.Popen(spec["argv"], env=env))
    while any(t.poll() is None for t in tasks):
        time.sleep(1.0)  # slow to reap, like a busy daemon: the agent may see zombies
    """
)


def test_an_srun_task_is_a_rank_only_when_stormwatch_run_marked_it() -> None:
    slurm = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8"}
    assert rank_env(slurm) is None  # any srun task: not a rank by itself
    marked = rank_env({**slurm, "STORMWATCH_RUN_ID": "41.0", "SLURM_RESTART_COUNT": "2"})
    assert marked is not None
    assert (marked.key, marked.local_rank, marked.world_size) == (("41.0", 5), 1, 8)
    assert marked.restart_count == 2
    torchrun = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "t"}
    inside = rank_env({**slurm, **torchrun, "STORMWATCH_RUN_ID": "41.0"})
    assert inside is not None and inside.key == ("t", 0)  # torchrun's worker identity wins
    assert is_rank_launcher("slurmstepd", ["slurmstepd: [41.0]"])
    assert not is_rank_launcher("python3", ["python3", "slurmstepd.py"])


def test_slurm_tasks_under_stormwatch_run_are_found_and_their_exits_reported(
    start_agent: Any, tools: Any, tmp_path: Path
) -> None:
    agent = start_agent()
    job = f"srun-{uuid.uuid4().hex[:8]}"
    stepd = tmp_path / "slurmstepd"  # its process name is what the agent recognises
    stepd.write_text(f"#!{sys.executable}\n{STEPD}")
    stepd.chmod(0o755)
    metrics = agent.config.metrics_dir
    argv = [STORMWATCH, "run", "--metrics-dir", str(metrics), "--"]
    argv += [sys.executable, "-c", TASK, str(tmp_path)]
    spec = {"ntasks": 2, "job": job, "argv": argv}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "STORMWATCH_"))}
    daemon = subprocess.Popen([str(stepd), json.dumps(spec)], env=env)
    try:

        def ranks() -> dict[int, dict[str, Any]]:
            rows = tools.http("GET", agent.url + "/v1/ranks").json()["ranks"]
            return {row["rank"]: row for row in rows if row["job"] == job}

        found = tools.wait_for(lambda: (r := ranks()) and len(r) == 2 and r, timeout=60)
        assert {row["run_id"] for row in found.values()} == {"41.0"}
        assert {row["world_size"] for row in found.values()} == {2}
        assert all(row["alive"] for row in found.values())
        (tmp_path / "exit1").write_text("3")
        (tmp_path / "exit0").write_text("0")

        def exits() -> dict[int, dict[str, Any]]:
            events = tools.http("GET", agent.url + "/v1/events").json()["events"]
            return {e["rank"]: e for e in events if e["kind"] == "rank_exit" and e["job"] == job}

        seen = tools.wait_for(lambda: (e := exits()) and len(e) == 2 and e, timeout=30)
        assert seen[1]["exit_code"] == 3 and seen[1]["reason"] == "exit_code"
        assert seen[0]["exit_code"] == 0 and seen[0]["reason"] == "finished"
        # Both wrote their done marker (sys.exit is not an unhandled exception): a known
        # non-zero status still makes rank 1's exit unexpected.
        assert (metrics / "rank1.done").exists()
        assert seen[1]["pid"] == found[1]["pid"]  # the task itself: stormwatch run exec'd it
        scrape = tools.scrape(agent.url)
        assert (
            scrape.value("stormwatch_rank_unexpected_exits_total", training_job=job, rank="1") == 1
        )
        assert daemon.wait(30) == 0
    finally:
        for rank in (0, 1):  # the tasks end whatever happened
            (tmp_path / f"exit{rank}").write_text("0")
        daemon.wait(30)
