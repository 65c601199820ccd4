"""The lab's Slurm cluster with real daemons: munged, slurmctld and one slurmd per namespace.

Each test module run gets its own names (bridge ``swslt<xx>br0``, namespaces
``swslt<xx>-node<i>``), a free 10.215.x.0/24 subnet and a free slurmctld port, so it runs
beside a developer's lab (``sw*``, 10.213.0.0/24) and the lab tests (10.214.x.0/24); the
fixtures are the shared ones of tests/conftest.py.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from stormwatch.lab.netns import IpRoute2
from stormwatch.lab.slurm import SlurmCluster
from stormwatch.lab.slurm.daemons import cluster_processes, read_pid

pytestmark = [pytest.mark.e2e, pytest.mark.root]

NODES = 3
# The shared Slurm fixtures (tests/conftest.py: slurm_network, slurm_config, slurm_cluster).
SLURM_PREFIX = "swslt"
SLURM_SUBNET = "10.215"
SLURM_NODES = NODES


def _wait_state(slurm_cluster: SlurmCluster, job: str, wanted: set[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = slurm_cluster.commands.job(job).state
        if state in wanted:
            return state
        time.sleep(0.05)
    raise AssertionError(f"job {job} is {state}, not {wanted}, after {timeout} s")


def _mounts_mentioning(text: str) -> list[str]:
    found = []
    for pid in psutil.pids():
        try:
            if text in Path(f"/proc/{pid}/mountinfo").read_text():
                found.append(f"pid {pid}")
        except OSError:
            continue
    return found


def test_nodes_come_up_idle_and_a_two_node_job_completes(slurm_cluster: SlurmCluster) -> None:
    nodes = slurm_cluster.commands.nodes()
    assert {n: info.state for n, info in nodes.items()} == {f"node{i}": "IDLE" for i in range(3)}
    sinfo = slurm_cluster.commands(["sinfo", "--noheader", "--format=%n %t %P"])
    assert sorted(sinfo.splitlines()) == [f"node{i} idle lab*" for i in range(3)]

    out = slurm_cluster.config.run_dir / "job-%j.out"
    submitted = time.monotonic()
    job = slurm_cluster.commands.submit(
        ["--nodes=2", "--gpus-per-node=2", f"--output={out}", "--wrap", "srun hostname"]
    )
    state = _wait_state(slurm_cluster, job, {"RUNNING", "COMPLETING", "COMPLETED"}, timeout=20)
    print(f"sbatch to {state}: {time.monotonic() - submitted:.2f} s")
    assert _wait_state(slurm_cluster, job, {"COMPLETED", "FAILED"}, timeout=30) == "COMPLETED"
    info = slurm_cluster.commands.job(job)
    assert info.exit_code == "0:0" and info.nodes == "node[0-1]"
    printed = (slurm_cluster.config.run_dir / f"job-{job}.out").read_text().split()
    assert sorted(printed) == ["node0", "node1"]  # each step task saw its node's hostname


def test_a_drained_node_is_read_back_with_its_reason(slurm_cluster: SlurmCluster) -> None:
    slurm_cluster.commands.update_node("node2", "DRAIN", reason="stormwatch test drain")
    node = slurm_cluster.commands.nodes()["node2"]
    assert "DRAIN" in node.flags
    assert node.reason is not None and node.reason.startswith("stormwatch test drain")
    slurm_cluster.commands.update_node("node2", "RESUME")
    # Resumed, it is IDLE+NOT_RESPONDING until slurmctld has heard from it (~0.5 s).
    assert slurm_cluster.wait_ready(timeout=10)["node2"].state == "IDLE"


def test_a_requeued_job_starts_again_within_seconds_of_its_begin_time(
    slurm_cluster: SlurmCluster,
) -> None:
    """A requeued job may start ``cred_expire + 1`` s later; nothing else holds it back.

    At Slurm's default ``sched_interval`` (60 s) it waited for the next scheduler pass,
    25 s in CI, long enough for a node cut off from the lab to return and take the job
    again (tests/chaos/test_slurm_lab_scenarios.py's node cut failed so).
    """
    job = slurm_cluster.commands.submit(
        ["--nodes=1", "--requeue", f"--chdir={slurm_cluster.config.run_dir}", "--wrap", "sleep 300"]
    )
    _wait_state(slurm_cluster, job, {"RUNNING"}, timeout=20)
    try:
        slurm_cluster.commands.requeue(job)
        requeued = time.monotonic()
        _wait_state(slurm_cluster, job, {"PENDING"}, timeout=20)
        eligible = slurm_cluster.config.cred_expire_s + 1
        _wait_state(slurm_cluster, job, {"RUNNING"}, timeout=eligible + 30)
        waited = time.monotonic() - requeued
        print(f"requeue to running again: {waited:.1f} s (eligible after {eligible} s)")
        # KillWait (5 s) at most before PENDING, then the begin time, then 1 s passes.
        assert waited <= eligible + slurm_cluster.config.kill_wait_s + 4.0
    finally:
        slurm_cluster.commands(["scancel", job])
        _wait_state(slurm_cluster, job, {"CANCELLED"}, timeout=30)


def test_stop_with_a_running_job_leaves_no_process_file_mount_or_namespace(
    slurm_cluster: SlurmCluster, slurm_network: tuple[str, ipaddress.IPv4Network]
) -> None:
    job = slurm_cluster.commands.submit(
        ["--nodes=2", f"--chdir={slurm_cluster.config.run_dir}", "--wrap", "srun sleep 300"]
    )
    _wait_state(slurm_cluster, job, {"RUNNING"}, timeout=20)
    deadline = time.monotonic() + 10
    while "sleep" not in {p.name() for p in _cluster_procs(slurm_cluster)}:
        assert time.monotonic() < deadline, "the job's sleep never started"
        time.sleep(0.05)

    started = time.monotonic()
    slurm_cluster.stop()
    print(f"stop with a running two-node step: {time.monotonic() - started:.2f} s")
    _assert_nothing_left(slurm_cluster, slurm_network[0])
    slurm_cluster.stop()  # idempotent
    _assert_nothing_left(slurm_cluster, slurm_network[0])


def test_stop_after_a_crash_with_stale_pid_files_leaves_nothing(
    slurm_cluster: SlurmCluster, slurm_network: tuple[str, ipaddress.IPv4Network]
) -> None:
    paths = slurm_cluster.paths
    pid_files = [paths.munged_pid, paths.slurmctld_pid]
    pid_files += [paths.slurmd_pid(n.name) for n in slurm_cluster.config.nodes]
    for pid_file in pid_files:
        pid = read_pid(pid_file)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    # The pid files now name dead processes (or, later, someone else's).
    SlurmCluster(slurm_cluster.config).stop()  # a fresh object: knows nothing but the config
    _assert_nothing_left(slurm_cluster, slurm_network[0])


def _cluster_procs(slurm_cluster: SlurmCluster) -> list[psutil.Process]:
    return cluster_processes(slurm_cluster.config)


def _assert_nothing_left(slurm_cluster: SlurmCluster, prefix: str) -> None:
    assert slurm_cluster.leftovers() == []
    names = {"munged", "slurmctld", "slurmd", "slurmstepd"}
    conf = str(slurm_cluster.paths.slurm_conf)
    for proc in psutil.process_iter():
        try:
            if proc.name() in names:
                assert proc.environ().get("SLURM_CONF") != conf, proc
        except psutil.Error:
            continue
    assert _mounts_mentioning(str(slurm_cluster.paths.root)) == []
    net = IpRoute2()
    for i in range(NODES):
        assert net.namespace_pids(f"{prefix}-node{i}") == []
