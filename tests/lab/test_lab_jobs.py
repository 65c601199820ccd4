"""Jobs in the lab: one torchrun per namespace joined into one world over the lab bridge.

The tests share one lab (bringing it up takes ~8 s); the last test brings it down. It has
the two nodes of a job with one rank each (:data:`LAB_SHAPE`): the subjects here are a job
across namespaces and its start, wait, failure and stop, which take one torchrun per node
whatever its ranks; every job then imports torch in 2 ranks instead of 4. Several ranks of a
node are covered on the catalogue's 2 x 2 lab (tests/chaos/test_catalogue_on_lab.py: a kill of
a node's training processes reaches both, torchrun restarts a killed rank's sibling).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from stormwatch.lab import JobError, JobSpec, Lab
from stormwatch.telemetry.events import log_path, read_events

pytestmark = [pytest.mark.e2e, pytest.mark.root]
#: The lab's shape (conftest's ``lab``): two nodes (no spare: no job here moves) of one rank
#: each.
LAB_SHAPE = {"nodes": 2, "nproc_per_node": 1}

ALLREDUCE = Path(__file__).with_name("allreduce_job.py")


def _allreduce(name: str, out: Path, sleep_s: float = 0.0) -> JobSpec:
    return JobSpec(
        name=name, steps=1, entrypoint=(sys.executable, str(ALLREDUCE), str(out), str(sleep_s))
    )


def _job_processes(name: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("STORMWATCH_JOB") == name and proc.status() != "zombie":
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_gloo_all_reduce_spans_both_namespaces(lab: Lab, tmp_path: Path) -> None:
    info = lab.start_job(_allreduce("allreduce", tmp_path))
    assert set(info.node_pids) == {"node0", "node1"}
    result = lab.wait_job("allreduce", timeout=180)
    assert result.ok, {n: p.read_text()[-2000:] for n, p in info.node_logs.items()}
    assert result.exit_codes == {"node0": 0, "node1": 0}
    state = lab.state
    world, per_node = state.config.world_size, state.config.nproc_per_node
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert {r["world_size"] for r in ranks} == {world}
    # 1 + 2 + ... + world: every rank took part
    assert {r["sum"] for r in ranks} == {float(world * (world + 1) // 2)}
    assert {r["master_addr"] for r in ranks} == {str(state.nodes[0].address)}
    assert {r["gloo_ifname"] for r in ranks} == {"eth0"}
    assert {r["job"] for r in ranks} == {"allreduce"}
    # Rank r runs in node (r // per_node)'s namespace (rank 0 in node0's, rank 1 in node1's),
    # with its node's metrics dir.
    assert [r["metrics_dir"] for r in ranks] == [
        str(state.nodes[r // per_node].metrics_dir) for r in range(world)
    ]


def test_trainer_job_runs_to_completion(
    lab: Lab, run_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    run_dir = str(lab.run_dir)
    train = run_cli(
        "lab",
        "train",
        "--run-dir",
        run_dir,
        "--job",
        "tiny",
        "--steps",
        "4",
        "--checkpoint-every",
        "2",
    )
    assert train.returncode == 0, train.stderr
    assert "torchrun pid" in train.stderr
    waited = run_cli("lab", "wait", "--run-dir", run_dir, "--job", "tiny", "--timeout", "400")
    info = lab.job("tiny")
    logs = {n: p.read_text()[-3000:] for n, p in info.node_logs.items()}
    assert waited.returncode == 0, (waited.stderr, logs)
    assert "node0: torchrun exit code 0" in waited.stderr
    assert "node1: torchrun exit code 0" in waited.stderr
    for rank in range(lab.state.config.world_size):
        events = read_events(log_path(info.log_dir, rank))
        assert events[-1].event == "done" and events[-1].step == 4
    assert any(info.checkpoint_dir.iterdir())
    status = run_cli("lab", "status", "--run-dir", run_dir, "--json")
    [job] = [j for j in json.loads(status.stdout)["jobs"] if j["name"] == "tiny"]
    assert job["running"] is False and job["exit_codes"] == {"node0": 0, "node1": 0}


def test_concurrent_jobs_get_their_own_rendezvous_port(
    lab: Lab, tmp_path: Path, run_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    # Every job used rendezvous port 29400 on node0: a second job failed with
    # EADDRINUSE buried in node0.torchrun.log.
    first = lab.start_job(_allreduce("c1", tmp_path / "c1", sleep_s=8))
    second = lab.start_job(_allreduce("c2", tmp_path / "c2", sleep_s=0))
    assert first.rdzv_port == lab.state.config.rdzv_port
    assert second.rdzv_port is not None and second.rdzv_port != first.rdzv_port
    status = run_cli("lab", "status", "--run-dir", str(lab.run_dir))
    assert "node0=running" in status.stdout and "=None" not in status.stdout, status.stdout
    for name, info in (("c2", second), ("c1", first)):
        result = lab.wait_job(name, timeout=240)
        assert result.ok, (
            result.detail,
            {n: p.read_text()[-2000:] for n, p in info.node_logs.items()},
        )
        assert result.detail is None


def test_a_failed_job_says_why(
    lab: Lab, run_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    crash = "import sys; print('ValueError: boom-42', file=sys.stderr); sys.exit(3)"
    lab.start_job(
        JobSpec(name="crash", steps=1, max_restarts=0, entrypoint=(sys.executable, "-c", crash))
    )
    result = lab.wait_job("crash", timeout=240)
    assert not result.ok and result.detail is not None
    assert "node0 (exit 1)" in result.detail and "ValueError: boom-42" in result.detail
    waited = run_cli("lab", "wait", "--run-dir", str(lab.run_dir), "--job", "crash")
    assert waited.returncode == 1
    assert "why:" in waited.stderr and "ValueError: boom-42" in waited.stderr, waited.stderr


def test_stop_job_and_down_leave_no_torchrun_or_worker(lab: Lab, tmp_path: Path) -> None:
    """Last test of the module: it brings the shared lab down."""
    lab.start_job(_allreduce("stopme", tmp_path / "a", sleep_s=300))
    # a supervisor and a torchrun per node, and the workers
    every = 2 * lab.state.config.job_nodes + lab.state.config.world_size
    deadline = time.monotonic() + 120
    while len(_job_processes("stopme")) < every:
        assert time.monotonic() < deadline, "workers did not start"
        time.sleep(0.2)
    with pytest.raises(JobError, match="still running"):
        lab.start_job(_allreduce("stopme", tmp_path / "b"))
    result = lab.stop_job("stopme", grace=5)
    assert not result.ok and set(result.exit_codes) == {"node0", "node1"}
    assert _job_processes("stopme") == []

    lab.start_job(_allreduce("downme", tmp_path / "c", sleep_s=300))
    while len(_job_processes("downme")) < every:
        assert time.monotonic() < deadline + 120, "workers did not start"
        time.sleep(0.2)
    lab.down()
    assert _job_processes("downme") == []
    assert lab.status().jobs[-1].stopped is True
