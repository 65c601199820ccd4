"""Lab jobs through Slurm (``LabConfig.scheduler`` ``slurm``): ``sbatch`` of
deploy/slurm/train.sbatch, one torchrun per node started by ``srun`` in the node's
namespace, control (find, state, cancel) through Slurm, in-job restarts by torchrun.

Runs on its own names (prefix ``swlj``, 10.218.1.0/24, free ports): no
``/tmp/stormwatch-e2e.lock`` needed.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from stormwatch.lab import JobSpec, Lab, LabConfig
from stormwatch.lab.jobs import slurmjob
from stormwatch.platforms.slurm import SlurmCommands
from stormwatch.telemetry.ranklogs import read_job_logs

pytestmark = [pytest.mark.e2e, pytest.mark.root]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def lab(lab_possible: None) -> Iterator[Lab]:
    """A Slurm lab of three nodes (its jobs on two), up for the module."""
    ports: set[int] = set()
    while len(ports) < 4:
        ports.add(_free_port())
    prometheus, alertmanager, responder, slurmctld = sorted(ports)
    config = LabConfig(
        prefix="swlj",
        subnet=ipaddress.IPv4Network("10.218.1.0/24"),
        prometheus_port=prometheus,
        alertmanager_port=alertmanager,
        responder_port=responder,
        slurmctld_port=slurmctld,
        rdzv_port=29610,
        scheduler="slurm",
    )
    run_dir = Path(tempfile.mkdtemp(prefix="swlj-run-"))
    run_dir.chmod(0o755)
    the_lab = Lab(run_dir)
    try:
        the_lab.up(config)
        yield the_lab
    finally:
        the_lab.down(config)
        shutil.rmtree(run_dir, ignore_errors=True)


def _slurm(lab: Lab) -> SlurmCommands:
    assert lab.state.slurm is not None
    return SlurmCommands(conf=lab.state.slurm.conf)


def test_a_job_is_submitted_with_sbatch_and_runs_one_torchrun_per_node(lab: Lab) -> None:
    started = time.monotonic()
    info = lab.start_job(JobSpec(name="sb", steps=6, checkpoint_every=3))
    print(f"start_job (sbatch to every torchrun up): {time.monotonic() - started:.2f} s")
    assert info.slurm_job_id is not None
    assert set(info.node_pids) == {"node0", "node1"}  # the job's two nodes; node2 is spare
    [job] = _slurm(lab).jobs_named("sb")
    assert job.job_id == info.slurm_job_id and job.nodes == "node[0-1]"
    result = lab.wait_job("sb", timeout=600)
    assert result.ok, result.detail
    assert result.exit_codes == {"node0": 0, "node1": 0}
    logs = read_job_logs(Path(info.log_dir))
    assert sorted(logs) == [0, 1, 2, 3] and all(log.finished for log in logs.values())
    assert all(Path(p).exists() for p in info.node_logs.values())
    assert _slurm(lab).job(info.slurm_job_id).state == "COMPLETED"
    assert _slurm(lab).nodes()["node2"].state == "IDLE"


def test_stop_job_cancels_it_through_slurm(lab: Lab) -> None:
    info = lab.start_job(JobSpec(name="cancel", steps=500, step_delay=0.5))
    result = lab.stop_job("cancel", grace=5.0)
    assert not result.ok
    assert all(code not in (None, 0) for code in result.exit_codes.values()), result
    assert info.slurm_job_id is not None
    assert _slurm(lab).job(info.slurm_job_id).state == "CANCELLED"
    assert slurmjob.torchruns(info.slurm_job_id) == {}


def test_a_killed_rank_is_restarted_by_torchrun_inside_the_slurm_job(lab: Lab) -> None:
    info = lab.start_job(JobSpec(name="restart", steps=30, checkpoint_every=5, step_delay=0.2))
    log_dir = Path(info.log_dir)
    deadline = time.monotonic() + 300
    while True:
        logs = read_job_logs(log_dir)
        if 1 in logs and logs[1].last_step is not None and logs[1].last_step.step >= 6:
            break
        assert time.monotonic() < deadline, "rank 1 never reached step 6"
        time.sleep(0.5)
    os.kill(logs[1].starts[-1].pid, signal.SIGKILL)
    result = lab.wait_job("restart", timeout=600)
    assert result.ok, result.detail
    logs = read_job_logs(log_dir)
    assert logs[1].latest_attempt == 1 and logs[1].finished
    assert not psutil.pid_exists(info.node_pids["node0"])
