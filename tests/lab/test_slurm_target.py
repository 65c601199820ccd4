"""A hand-written slurm target file attaching to a job of a real Slurm cluster (munged,
slurmctld, one slurmd per namespace: :class:`stormwatch.lab.slurm.SlurmCluster`).

Own names (bridge ``swslt<xx>br0``, namespaces ``swslt<xx>-node<i>``), a free
10.215.x.0/24 subnet and a free slurmctld port, as tests/lab/test_slurm_cluster.py.
"""

from __future__ import annotations

import ipaddress
import random
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stormwatch.chaos.platform_target import target_from_file
from stormwatch.lab.errors import SlurmError
from stormwatch.lab.netns import IpRoute2
from stormwatch.lab.slurm import SlurmCluster, SlurmClusterConfig, SlurmNode
from stormwatch.lab.slurm.daemons import require_tools
from stormwatch.platforms.targets import load_target_file

pytestmark = [pytest.mark.e2e, pytest.mark.root]

NODES = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def cluster(lab_possible: None) -> Iterator[SlurmCluster]:
    """A started 3-node cluster on its own bridge and namespaces; all removed afterwards."""
    try:
        require_tools()
    except SlurmError as exc:
        pytest.skip(str(exc))
    net = IpRoute2()
    used = [iface.network for _, iface in net.addresses()]
    subnet = next(
        c
        for c in (ipaddress.IPv4Network(f"10.215.{random.randrange(256)}.0/24") for _ in range(100))
        if not any(c.overlaps(u) for u in used)
    )
    prefix = f"swslt{random.randrange(16**2):02x}"
    run_dir = Path(tempfile.mkdtemp(prefix=f"{prefix}-run-"))
    run_dir.chmod(0o755)  # munged runs as the munge user
    slurm: SlurmCluster | None = None
    try:
        net.add_bridge(f"{prefix}br0", ipaddress.IPv4Interface(f"{subnet[1]}/24"))
        for i in range(NODES):
            net.add_namespace(f"{prefix}-node{i}", {})
            net.add_node_link(
                netns=f"{prefix}-node{i}",
                veth=f"{prefix}v{i}",
                interface="eth0",
                bridge=f"{prefix}br0",
                address=ipaddress.IPv4Interface(f"{subnet[10 + i]}/24"),
                gateway=subnet[1],
            )
        nodes = tuple(
            SlurmNode(name=f"node{i}", netns=f"{prefix}-node{i}", address=subnet[10 + i], gpus=2)
            for i in range(NODES)
        )
        slurm = SlurmCluster(
            SlurmClusterConfig(
                run_dir=run_dir,
                nodes=nodes,
                controller_address=subnet[1],
                cluster_name=prefix,
                slurmctld_port=_free_port(),
                ready_timeout_s=20.0,
            )
        )
        slurm.start()
        yield slurm
    finally:
        if slurm is not None:
            slurm.stop()
        for i in range(NODES):
            net.delete_namespace(f"{prefix}-node{i}")
            net.delete_link(f"{prefix}v{i}")
        net.delete_link(f"{prefix}br0")
        shutil.rmtree(run_dir, ignore_errors=True)


def _running(cluster: SlurmCluster, job: str, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = cluster.commands.job(job).state
        if state == "RUNNING":
            return state
        time.sleep(0.05)
    raise AssertionError(f"job {job} is {state}, not RUNNING, after {timeout} s")


@pytest.mark.parametrize("attach", ["name", "id"])
def test_a_slurm_target_attaches_to_a_running_job_by_name_or_id(
    cluster: SlurmCluster, tmp_path: Path, attach: str
) -> None:
    run_dir = cluster.config.run_dir
    job_id = cluster.commands.submit(
        ["--nodes=2", "--job-name=swtarget", f"--chdir={run_dir}", "--wrap", "sleep 60"]
    )
    _running(cluster, job_id)
    token = tmp_path / "agent.token"
    token.write_text("secret\n")
    ref = "name: swtarget" if attach == "name" else f"id: '{job_id}'"
    target_file = tmp_path / "target.yaml"
    target_file.write_text(
        "platform: slurm\n"
        "prometheus: {url: 'http://127.0.0.1:9090'}\n"
        "agents: {port: 9402, fault_port: 9401, host: '{addr}'}\n"
        "credentials: {agent_token_file: agent.token}\n"
        f"job: {{attach: {{{ref}}}}}\n"
        f"slurm: {{conf: {cluster.paths.slurm_conf}, nproc_per_node: 2}}\n"
    )
    target = target_from_file(load_target_file(target_file), tmp_path)

    info = cluster.commands.job(job_id)
    hosts = cluster.commands(["scontrol", "show", "hostnames", info.nodes]).split()
    addresses = {n.name: str(n.address) for n in cluster.config.nodes}
    assert len(hosts) == 2
    assert [a.node for a in target.agents] == hosts
    assert [a.url for a in target.agents] == [f"http://{addresses[h]}:9402" for h in hosts]
    assert [a.fault_api for a in target.agents] == [f"http://{addresses[h]}:9401" for h in hosts]
    assert target.attach_job == "swtarget"
    assert target.world_size == 4
    assert target.agent_token_file == token
    assert target.placement is not None
    assert dict(target.placement.ranks("swtarget")) == {
        0: hosts[0],
        1: hosts[0],
        2: hosts[1],
        3: hosts[1],
    }
    assert target.jobs.exited("swtarget") is None  # still running
    cluster.commands(["scancel", job_id])
    deadline = time.monotonic() + 15
    while target.jobs.exited("swtarget") is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert target.jobs.exited("swtarget") is False  # CANCELLED
