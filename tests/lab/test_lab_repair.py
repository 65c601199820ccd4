"""A lab that is up keeps its jobs: ``lab up`` repairs dead services in place, a
``lab down`` with a mistyped ``--run-dir`` refuses, and a rebuild is refused while
jobs run (unless ``--force``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stormwatch.lab import JobSpec, Lab, LabConfig
from stormwatch.lab.netns import IpRoute2
from stormwatch.lab.services import procs
from stormwatch.lab.slurm.daemons import read_pid
from stormwatch.lab.slurm.lab_cluster import lab_cluster
from stormwatch.lab.state import ProcessRecord

pytestmark = [pytest.mark.e2e, pytest.mark.root]

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def _wait_dead(record: ProcessRecord) -> None:
    deadline = time.monotonic() + 30
    while procs.is_running(record):
        assert time.monotonic() < deadline, f"{record.name} did not die"
        time.sleep(0.1)


def test_up_repairs_dead_services_keeps_jobs_and_down_elsewhere_refuses(
    tmp_path: Path,
    lab_config: LabConfig,
    run_cli: RunCli,
    config_args: Callable[[LabConfig], list[str]],
    nothing_left: Callable[[LabConfig, Path], list[str]],
    cleanup_lab: Callable[[LabConfig, Path], None],
) -> None:
    run_dir = tmp_path / "lab"
    cleanup_lab(lab_config, run_dir)
    up = run_cli("lab", "up", "--run-dir", str(run_dir), *config_args(lab_config))
    assert up.returncode == 0, up.stderr
    the_lab = Lab(run_dir)
    the_lab.start_job(JobSpec(name="sleeper", steps=1, entrypoint=("/bin/sleep", "600")))
    job = the_lab.state.job("sleeper")

    # 1. A mistyped --run-dir (no lab.json there) must not touch this lab.
    typo = tmp_path / "typo"
    typo.mkdir()
    down = run_cli("lab", "down", "--run-dir", str(typo), "--prefix", lab_config.prefix)
    assert down.returncode == 2, down.stderr
    assert str(run_dir) in down.stderr and "lab down --run-dir" in down.stderr
    assert "Traceback" not in down.stderr
    assert the_lab.job_result("sleeper").exit_codes == {"node0": None, "node1": None}

    # 2. Prometheus dies; `lab up` restarts only it and the job keeps running.
    before = the_lab.state.processes
    prometheus = before["prometheus"]
    os.kill(prometheus.pid, signal.SIGKILL)
    _wait_dead(prometheus)
    again = run_cli("lab", "up", "--run-dir", str(run_dir), *config_args(lab_config))
    assert again.returncode == 0, again.stderr
    assert "restarting dead services: prometheus" in again.stderr
    assert "removing the remains" not in again.stderr
    after = the_lab.state
    assert after.processes["prometheus"].pid != prometheus.pid
    assert {n: r for n, r in after.processes.items() if n != "prometheus"} == {
        n: r for n, r in before.items() if n != "prometheus"
    }
    assert after.job("sleeper").processes == job.processes
    assert all(procs.is_running(p) for p in job.processes.values())
    status = run_cli("lab", "status", "--run-dir", str(run_dir), "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["healthy"] is True

    # 2b. slurmctld and node1's slurmd die; `lab up` restarts them (state kept, no rebuild).
    cluster = lab_cluster(run_dir, lab_config)
    dead_pids = [
        read_pid(cluster.paths.slurmctld_pid),
        read_pid(cluster.paths.slurmd_pid("node1")),
    ]
    for pid in dead_pids:
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while cluster.dead_daemons() != ["slurmctld", "slurmd@node1"]:
        assert time.monotonic() < deadline, cluster.dead_daemons()
        time.sleep(0.1)
    again = run_cli("lab", "up", "--run-dir", str(run_dir), *config_args(lab_config))
    assert again.returncode == 0, again.stderr
    assert "restarted slurmctld, slurmd@node1" in again.stderr, again.stderr
    assert "removing the remains" not in again.stderr
    assert cluster.dead_daemons() == []
    assert after.job("sleeper").processes == job.processes
    status = run_cli("lab", "status", "--run-dir", str(run_dir), "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["healthy"] is True, status.stdout

    # 3. A node's torchrun dies for good: status says the job cannot finish.
    os.kill(job.processes["node1"].pid, signal.SIGKILL)
    _wait_dead(job.processes["node1"])
    deadline = time.monotonic() + 30
    while procs.exit_status(job.processes["node1"]).returncode is None:
        assert time.monotonic() < deadline, "node1's exit was not recorded"
        time.sleep(0.1)
    report = json.loads(run_cli("lab", "status", "--run-dir", str(run_dir), "--json").stdout)
    [sleeper] = report["jobs"]
    assert sleeper["running"] is True and sleeper["exit_codes"]["node1"] == -signal.SIGKILL
    assert "cannot finish" in sleeper["problem"] and "node1" in sleeper["problem"]
    human = run_cli("lab", "status", "--run-dir", str(run_dir))
    assert "lab stop --job sleeper" in " ".join(human.stdout.split())

    # 4. A lab that cannot be repaired in place is not rebuilt under a running job.
    os.kill(after.processes["responder"].pid, signal.SIGKILL)
    IpRoute2().delete_link(after.bridge)
    refused = run_cli("lab", "up", "--run-dir", str(run_dir), *config_args(lab_config))
    assert refused.returncode != 0
    assert "sleeper" in refused.stderr and "--force" in refused.stderr
    assert "responder" in refused.stderr
    assert procs.is_running(job.processes["node0"])
    assert "sleeper" in the_lab.state.jobs

    final = run_cli("lab", "down", "--run-dir", str(run_dir))
    assert final.returncode == 0, final.stderr
    assert nothing_left(lab_config, run_dir) == []
