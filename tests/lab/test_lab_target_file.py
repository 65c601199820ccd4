"""``lab up`` writes the lab's target file (a ``slurm`` target of the lab's cluster with a
``lab:`` section on the Slurm lab, a ``lab`` target with the direct scheduler); ``lab status``
shows its path; the chaos commands without ``--target`` use it, and start jobs through the lab."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from stormwatch.chaos.errors import LabNotReady
from stormwatch.chaos.platform_target import resolve_target
from stormwatch.errors import ConfigError
from stormwatch.lab import JobSpec, Lab, LabConfig
from stormwatch.lab.jobs import slurmjob
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.slurm.lab_cluster import cluster_config
from stormwatch.lab.slurm.render import render_slurm_conf
from stormwatch.lab.state import LabState, StateStore, plan_state
from stormwatch.lab.status import LabStatus, render_status
from stormwatch.platforms.base import control_dir_for
from stormwatch.platforms.targets import load_target_file


def _planned(run_dir: Path, config: LabConfig) -> LabState:
    """lab.json of a lab that is starting, and the target file ``lab up`` writes for it."""
    paths = RunPaths.of(run_dir)
    state = plan_state(paths, config)
    StateStore(paths).save(state)
    Lab(run_dir)._write_target_file(state)
    return state


def test_the_slurm_lab_writes_a_slurm_target_of_its_own_cluster(tmp_path: Path) -> None:
    config = LabConfig(agent_port=9410, agent_fault_port=9411)
    state = _planned(tmp_path, config)
    paths = RunPaths.of(tmp_path)
    target = load_target_file(paths.target_file)
    assert target.platform == "slurm" and target.job is None
    assert target.slurm.conf == cluster_config(paths.run_dir, config).paths.slurm_conf
    assert target.slurm.nproc_per_node == config.nproc_per_node
    assert target.prometheus is not None and target.prometheus.url == state.prometheus_url
    creds = target.credentials
    assert creds.agent_token_file == state.agent_token_file and creds.agent_token_file.is_file()
    assert creds.responder_url == state.responder_url
    assert creds.responder_token_file == state.responder_token_file
    # the agents, at Slurm's NodeAddr (the node's namespace address) and the lab's ports
    agents = target.agents
    for node in state.nodes:
        host = agents.host.format(node=node.name, addr=node.address)
        assert f"{agents.scheme}://{host}:{agents.port}" == node.agent_url
        assert f"{agents.scheme}://{host}:{agents.fault_port}" == node.agent_fault_url
    # rank 0's control directory is where the recipe's rank 0 reads it (node of rank 0)
    env = slurmjob.environment(state, JobSpec(name="j"), paths, {}, 29500)
    node0_control = env["STORMWATCH_CONTROL_DIR"].replace("%n", "node0")
    assert target.slurm.control_dir is not None
    pattern = target.slurm.control_dir
    assert control_dir_for(pattern, job="j", job_id="7", nodes=["node0", "node2"]) == Path(
        node0_control
    )
    # the lab: section says this Slurm cluster is a stormwatch lab
    assert target.lab is not None and target.lab.run_dir == paths.run_dir
    assert [(n.name, n.metrics_dir) for n in target.lab.nodes] == [
        (n.name, n.metrics_dir) for n in state.nodes
    ]
    # so chaos goes through the lab (which is not up here: the lab's own answer)
    with pytest.raises(LabNotReady, match="not 'up'"):
        resolve_target(tmp_path, None)


def test_the_direct_scheduler_lab_writes_a_lab_target(tmp_path: Path) -> None:
    _planned(tmp_path, LabConfig(scheduler="direct"))
    target = load_target_file(RunPaths.of(tmp_path).target_file)
    assert target.platform == "lab" and target.lab is not None
    assert target.model_fields_set == {"platform", "lab", "prometheus", "grace_period_s"}
    assert target.grace_period_s == 5  # the lab's, what its responder's stops use


def test_the_labs_grace_period_is_its_target_files_and_its_slurm_kill_wait(tmp_path: Path) -> None:
    config = LabConfig(grace_period_s=12)
    _planned(tmp_path, config)
    assert load_target_file(RunPaths.of(tmp_path).target_file).grace_period_s == 12
    conf = render_slurm_conf(cluster_config(tmp_path, config)).splitlines()
    assert "KillWait=12" in conf and not any(line.startswith("KillWait=5") for line in conf)
    with pytest.raises(ConfigError, match=r"LabConfig.grace_period_s: Input should be less than"):
        LabConfig(grace_period_s=7200)


def test_lab_up_keeps_the_runs_own_responder_policy(tmp_path: Path) -> None:
    """<run>/responder/policy.yml replaces the lab's policy; ``lab up`` must not wipe it
    while it clears the responder's earlier database and post-mortems."""
    from stormwatch.lab.builder import LabBuilder
    from stormwatch.lab.netns import IpRoute2

    paths = RunPaths.of(tmp_path)
    state = plan_state(paths, LabConfig())
    own = paths.responder_dir / "policy.yml"
    own.parent.mkdir(parents=True)
    own.write_text("rules: []\n")
    (paths.responder_dir / "postmortems").mkdir()
    paths.responder_db.write_text("old")
    builder = LabBuilder(paths, StateStore(paths), IpRoute2(), {})
    builder._prepare_files(state)
    assert sorted(p.name for p in paths.responder_dir.iterdir()) == ["policy.yml"]


def test_the_lab_target_file_names_the_lab_and_the_chaos_commands_use_it(
    tmp_path: Path,
) -> None:
    Lab(tmp_path)._write_target_file()
    path = RunPaths.of(tmp_path).target_file
    target = load_target_file(path)
    assert target.platform == "lab"
    assert target.lab is not None and target.lab.run_dir == RunPaths.of(tmp_path).run_dir
    with pytest.raises(LabNotReady, match=r"lab\.json"):  # no lab there: the lab's own answer
        resolve_target(tmp_path, None)


def test_lab_status_shows_the_target_file(tmp_path: Path) -> None:
    status = LabStatus(
        run_dir=tmp_path,
        phase="up",
        healthy=True,
        prometheus_url="http://127.0.0.1:19090",
        alertmanager_url="http://127.0.0.1:19093",
        responder_url="http://127.0.0.1:19095",
        nodes=[],
        services=[],
        jobs=[],
        target_file=tmp_path / "target.yaml",
    )
    console = Console(record=True, width=200)
    render_status(status, console)
    assert f"target file: {tmp_path / 'target.yaml'}" in console.export_text()
