"""The lab Slurm cluster's configuration: validation, and the files rendered from it."""

from __future__ import annotations

import pwd
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from stormwatch.errors import ConfigError
from stormwatch.lab.errors import SlurmError
from stormwatch.lab.slurm import (
    SlurmClusterConfig,
    SlurmNode,
    render_gres_conf,
    render_hosts,
    render_slurm_conf,
)
from stormwatch.lab.slurm.daemons import (
    MUNGE_USER,
    munged_command,
    prepare_munge,
    runtime_files,
    slurmd_command,
)
from stormwatch.platforms.slurm import SlurmJobInfo, SlurmNodeInfo, parse_oneliner

RUN = Path("/srv/run")


def _config(**overrides: object) -> SlurmClusterConfig:
    nodes = tuple(
        SlurmNode(
            name=f"node{i}", netns=f"sw-node{i}", address=IPv4Address(f"10.9.0.{10 + i}"), gpus=2
        )
        for i in range(3)
    )
    fields: dict[str, object] = {
        "run_dir": RUN,
        "nodes": nodes,
        "controller_address": IPv4Address("10.9.0.1"),
        "controller_host": "ctl",
        "slurmctld_port": 16817,
    }
    return SlurmClusterConfig(**{**fields, **overrides})  # type: ignore[arg-type]


def _settings(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and " " not in line)
    return {key: value for key, value in pairs}


def test_slurm_conf_holds_the_minimal_working_settings() -> None:
    conf = _settings(render_slurm_conf(_config()))
    assert conf["SlurmUser"] == "root"
    assert conf["AuthType"] == "auth/munge"
    assert conf["AuthInfo"] == "socket=/srv/run/slurm/munge/munge.socket,cred_expire=10"
    assert conf["ProctrackType"] == "proctrack/linuxproc"
    assert conf["TaskPlugin"] == "task/none"
    assert conf["SelectType"] == "select/cons_tres"
    assert conf["SelectTypeParameters"] == "CR_CPU"
    assert conf["ReturnToService"] == "2"
    assert conf["GresTypes"] == "gpu"
    assert conf["SlurmctldHost"] == "ctl(10.9.0.1)"
    assert conf["SlurmctldPort"] == "16817"
    assert conf["SlurmdSpoolDir"] == "/srv/run/slurm/nodes/%n/spool"
    assert conf["SlurmdPidFile"] == "/srv/run/slurm/nodes/%n/slurmd.pid"
    assert conf["SlurmdLogFile"] == "/srv/run/slurm/logs/slurmd-%n.log"
    assert conf["StateSaveLocation"] == "/srv/run/slurm/ctl/state"


def test_every_node_is_addressed_in_its_namespace_and_in_the_partition() -> None:
    text = render_slurm_conf(_config())
    assert "NodeName=node1 NodeAddr=10.9.0.11 CPUs=2 Gres=gpu:2 State=UNKNOWN" in text
    assert "PartitionName=lab Nodes=node0,node1,node2 Default=YES" in text


def test_gres_conf_lists_stand_in_device_files_per_node() -> None:
    text = render_gres_conf(_config())
    assert (
        "NodeName=node2 Name=gpu "
        "File=/srv/run/slurm/nodes/node2/dev/gpu0,/srv/run/slurm/nodes/node2/dev/gpu1"
    ) in text
    cpu_only = _config(nodes=(SlurmNode(name="n0", netns="x", address=IPv4Address("10.9.0.9")),))
    assert "File=" not in render_gres_conf(cpu_only)
    assert "Gres=" not in render_slurm_conf(cpu_only)


def test_hosts_file_names_the_controller_and_every_node() -> None:
    lines = render_hosts(_config()).splitlines()
    assert lines == [
        "127.0.0.1 localhost",
        "10.9.0.1 ctl",
        "10.9.0.10 node0",
        "10.9.0.11 node1",
        "10.9.0.12 node2",
    ]


def test_slurmd_enters_its_namespace_with_nsenter_not_ip_netns_exec() -> None:
    config = _config()
    argv = slurmd_command(config.paths, config.nodes[1])
    assert argv[:2] == ["nsenter", "--net=/run/netns/sw-node1"]
    assert argv[3:8] == ["unshare", "--uts", "--mount", "--propagation", "private"]
    assert argv[-3:] == ["/srv/run/slurm/nodes/node1/hosts", "node1", "/srv/run/slurm/slurm.conf"]
    assert "ip" not in argv


def test_munged_runs_as_munge_with_every_file_in_its_folder() -> None:
    argv = munged_command(_config().paths)
    assert argv[:4] == ["setpriv", "--reuid=munge", "--regid=munge", "--clear-groups"]
    assert all(a.startswith("--") and "/srv/run/slurm/munge/" in a for a in argv[5:])


def test_runtime_files_are_pid_files_spools_state_and_munge_secrets() -> None:
    found = {str(p) for p in runtime_files(_config())}
    assert "/srv/run/slurm/nodes/node0/spool" in found
    assert "/srv/run/slurm/nodes/node2/slurmd.pid" in found
    assert "/srv/run/slurm/ctl/state" in found
    assert "/srv/run/slurm/munge/munge.key" in found
    assert not any(p.endswith(".log") or p.endswith(".conf") for p in found)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"nodes": ()}, "nodes"),
        ({"run_dir": Path("run")}, "run_dir"),
        ({"slurmctld_port": 0}, "slurmctld_port"),
        ({"partition": "Lab Nodes"}, "partition"),
        ({"cred_expire_s": 0}, "cred_expire_s"),
    ],
)
def test_invalid_cluster_settings_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        _config(**overrides)


def test_two_nodes_may_not_share_an_address() -> None:
    same = IPv4Address("10.9.0.10")
    nodes = (
        SlurmNode(name="node0", netns="a", address=same),
        SlurmNode(name="node1", netns="b", address=same),
    )
    with pytest.raises(ConfigError, match="address"):
        _config(nodes=nodes)


@pytest.mark.parametrize("name", ["Node0", "0node", "node_0", ""])
def test_a_node_name_must_be_a_hostname(name: str) -> None:
    with pytest.raises(ConfigError, match=r"SlurmNode\.name"):
        SlurmNode(name=name, netns="x", address=IPv4Address("10.9.0.10"))


def test_scontrol_oneliner_records_keep_values_with_spaces() -> None:
    text = (
        "NodeName=node2 Arch=x86_64 CPUAlloc=0 State=IDLE+DRAIN ThreadsPerCore=1 "
        "OS=Linux 6.1.0-18-amd64 #1 SMP Debian Reason=link cut [root@2026-12-02T03:14:00] "
        "Comment=(null)\n"
        "NodeName=node0 State=IDLE Reason=\n"
    )
    first, second = (SlurmNodeInfo.of(r) for r in parse_oneliner(text))
    assert first == SlurmNodeInfo("node2", "IDLE+DRAIN", "link cut [root@2026-12-02T03:14:00]")
    assert (first.base_state, first.flags) == ("IDLE", frozenset({"DRAIN"}))
    assert second == SlurmNodeInfo("node0", "IDLE", None)


def test_a_job_record_reads_state_nodes_and_exit_code() -> None:
    text = (
        "JobId=7 JobName=wrap UserId=root(0) JobState=COMPLETED Reason=None "
        "ExitCode=0:0 NodeList=node[0-1] BatchHost=node0\n"
    )
    job = SlurmJobInfo.of(parse_oneliner(text)[0])
    assert job == SlurmJobInfo("7", "wrap", "COMPLETED", "node[0-1]", None, "0:0")


def test_a_run_dir_munge_cannot_enter_is_refused_naming_the_folder(tmp_path: Path) -> None:
    try:
        pwd.getpwnam(MUNGE_USER)
    except KeyError:
        pytest.skip("no munge user (apt-get install munge)")
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    config = _config(run_dir=closed / "run")
    with pytest.raises(SlurmError, match=f"cannot enter {closed}"):
        prepare_munge(config.paths)
    assert not config.paths.munge_key.exists()
