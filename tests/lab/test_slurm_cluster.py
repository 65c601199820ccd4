"""The lab's Slurm cluster with real daemons: munged, slurmctld and one slurmd per namespace.

Each test module run gets its own names (bridge ``swslt<xx>br0``, namespaces
``swslt<xx>-node<i>``), a free 10.215.x.0/24 subnet and a free slurmctld port, so it runs
beside a developer's lab (``sw*``, 10.213.0.0/24) and the lab tests (10.214.x.0/24).
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from stormwatch.lab.errors import SlurmError
from stormwatch.lab.netns import IpRoute2
from stormwatch.lab.slurm import SlurmCluster, SlurmClusterConfig, SlurmNode
from stormwatch.lab.slurm.daemons import cluster_processes, read_pid, require_tools

pytestmark = [pytest.mark.e2e, pytest.mark.root]

NODES = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _free_subnet(network: IpRoute2) -> ipaddress.IPv4Network:
    used = [iface.network for _, iface in network.addresses()]
    for _ in range(100):
        candidate = ipaddress.IPv4Network(f"10.215.{random.randrange(256)}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise RuntimeError("no free 10.215.x.0/24 subnet")


@pytest.fixture(scope="module")
def network(lab_possible: None) -> Iterator[tuple[str, ipaddress.IPv4Network]]:
    """A bridge and :data:`NODES` namespaces of this module alone; removed afterwards."""
    try:
        require_tools()
    except SlurmError as exc:
        pytest.skip(str(exc))
    net = IpRoute2()
    prefix = f"swslt{random.randrange(16**2):02x}"
    subnet = _free_subnet(net)
    bridge = f"{prefix}br0"
    try:
        net.add_bridge(bridge, ipaddress.IPv4Interface(f"{subnet[1]}/{subnet.prefixlen}"))
        for i in range(NODES):
            ns = f"{prefix}-node{i}"
            net.add_namespace(ns, {})
            net.add_node_link(
                netns=ns,
                veth=f"{prefix}v{i}",
                interface="eth0",
                bridge=bridge,
                address=ipaddress.IPv4Interface(f"{subnet[10 + i]}/{subnet.prefixlen}"),
                gateway=subnet[1],
            )
        yield prefix, subnet
    finally:
        for i in range(NODES):
            net.delete_namespace(f"{prefix}-node{i}")
            net.delete_link(f"{prefix}v{i}")
        net.delete_link(bridge)
    # Every cluster was stopped: nothing holds the namespaces, so they are gone.
    assert [n for n in net.namespaces() if n.startswith(prefix)] == []
    assert [n for n in net.links() if n.startswith(prefix)] == []


@pytest.fixture
def config(network: tuple[str, ipaddress.IPv4Network]) -> Iterator[SlurmClusterConfig]:
    """A cluster over the module's namespaces, in a run directory munge can enter
    (pytest's own folders are 0700, closed to the ``munge`` user)."""
    prefix, subnet = network
    run_dir = Path(tempfile.mkdtemp(prefix=f"{prefix}-run-"))
    run_dir.chmod(0o755)
    nodes = tuple(
        SlurmNode(name=f"node{i}", netns=f"{prefix}-node{i}", address=subnet[10 + i], gpus=2)
        for i in range(NODES)
    )
    yield SlurmClusterConfig(
        run_dir=run_dir,
        nodes=nodes,
        controller_address=subnet[1],
        cluster_name=prefix,
        slurmctld_port=_free_port(),
        ready_timeout_s=20.0,
    )
    shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def cluster(config: SlurmClusterConfig) -> Iterator[SlurmCluster]:
    """A started cluster; stopped (last resort) after the test."""
    cluster = SlurmCluster(config)
    started = time.monotonic()
    ready_after = cluster.start()
    print(
        f"cold start to {NODES} idle nodes: {ready_after:.2f} s "
        f"(start() {time.monotonic() - started:.2f} s)"
    )
    try:
        yield cluster
    finally:
        cluster.stop()


def _wait_state(cluster: SlurmCluster, job: str, wanted: set[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = cluster.commands.job(job).state
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


def test_nodes_come_up_idle_and_a_two_node_job_completes(cluster: SlurmCluster) -> None:
    nodes = cluster.commands.nodes()
    assert {n: info.state for n, info in nodes.items()} == {f"node{i}": "IDLE" for i in range(3)}
    sinfo = cluster.commands(["sinfo", "--noheader", "--format=%n %t %P"])
    assert sorted(sinfo.splitlines()) == [f"node{i} idle lab*" for i in range(3)]

    out = cluster.config.run_dir / "job-%j.out"
    submitted = time.monotonic()
    job = cluster.commands.submit(
        ["--nodes=2", "--gpus-per-node=2", f"--output={out}", "--wrap", "srun hostname"]
    )
    state = _wait_state(cluster, job, {"RUNNING", "COMPLETING", "COMPLETED"}, timeout=20)
    print(f"sbatch to {state}: {time.monotonic() - submitted:.2f} s")
    assert _wait_state(cluster, job, {"COMPLETED", "FAILED"}, timeout=30) == "COMPLETED"
    info = cluster.commands.job(job)
    assert info.exit_code == "0:0" and info.nodes == "node[0-1]"
    printed = (cluster.config.run_dir / f"job-{job}.out").read_text().split()
    assert sorted(printed) == ["node0", "node1"]  # each step task saw its node's hostname


def test_a_drained_node_is_read_back_with_its_reason(cluster: SlurmCluster) -> None:
    cluster.commands.update_node("node2", "DRAIN", reason="stormwatch test drain")
    node = cluster.commands.nodes()["node2"]
    assert "DRAIN" in node.flags
    assert node.reason is not None and node.reason.startswith("stormwatch test drain")
    cluster.commands.update_node("node2", "RESUME")
    # Resumed, it is IDLE+NOT_RESPONDING until slurmctld has heard from it (~0.5 s).
    assert cluster.wait_ready(timeout=10)["node2"].state == "IDLE"


def test_stop_with_a_running_job_leaves_no_process_file_mount_or_namespace(
    cluster: SlurmCluster, network: tuple[str, ipaddress.IPv4Network]
) -> None:
    job = cluster.commands.submit(
        ["--nodes=2", f"--chdir={cluster.config.run_dir}", "--wrap", "srun sleep 300"]
    )
    _wait_state(cluster, job, {"RUNNING"}, timeout=20)
    deadline = time.monotonic() + 10
    while "sleep" not in {p.name() for p in _cluster_procs(cluster)}:
        assert time.monotonic() < deadline, "the job's sleep never started"
        time.sleep(0.05)

    started = time.monotonic()
    cluster.stop()
    print(f"stop with a running two-node step: {time.monotonic() - started:.2f} s")
    _assert_nothing_left(cluster, network[0])
    cluster.stop()  # idempotent
    _assert_nothing_left(cluster, network[0])


def test_stop_after_a_crash_with_stale_pid_files_leaves_nothing(
    cluster: SlurmCluster, network: tuple[str, ipaddress.IPv4Network]
) -> None:
    paths = cluster.paths
    pid_files = [paths.munged_pid, paths.slurmctld_pid]
    pid_files += [paths.slurmd_pid(n.name) for n in cluster.config.nodes]
    for pid_file in pid_files:
        pid = read_pid(pid_file)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    # The pid files now name dead processes (or, later, someone else's).
    SlurmCluster(cluster.config).stop()  # a fresh object: knows nothing but the config
    _assert_nothing_left(cluster, network[0])


def _cluster_procs(cluster: SlurmCluster) -> list[psutil.Process]:
    return cluster_processes(cluster.config)


def _assert_nothing_left(cluster: SlurmCluster, prefix: str) -> None:
    assert cluster.leftovers() == []
    names = {"munged", "slurmctld", "slurmd", "slurmstepd"}
    conf = str(cluster.paths.slurm_conf)
    for proc in psutil.process_iter():
        try:
            if proc.name() in names:
                assert proc.environ().get("SLURM_CONF") != conf, proc
        except psutil.Error:
            continue
    assert _mounts_mentioning(str(cluster.paths.root)) == []
    net = IpRoute2()
    for i in range(NODES):
        assert net.namespace_pids(f"{prefix}-node{i}") == []
