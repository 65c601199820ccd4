"""LabConfig and JobSpec: validated at construction, errors name the field; derived names."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from click.testing import CliRunner

from stormwatch.chaos.lab import JobSpec, LabConfig
from stormwatch.chaos.lab.cli import lab
from stormwatch.chaos.lab.errors import LabNotUpError
from stormwatch.chaos.lab.paths import RunPaths
from stormwatch.chaos.lab.state import LabState, plan_state
from stormwatch.errors import ConfigError


def test_default_config_is_the_documented_lab() -> None:
    config = LabConfig()
    assert config.bridge == "swbr0"
    assert str(config.bridge_interface) == "10.213.0.1/24"
    assert [config.netns(i) for i in range(config.nodes)] == ["sw-node0", "sw-node1"]
    assert [str(config.node_address(i)) for i in range(2)] == ["10.213.0.10", "10.213.0.11"]
    assert config.world_size == 4
    assert (config.prometheus_port, config.alertmanager_port, config.responder_port) == (
        19090,
        19093,
        19095,
    )


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"nodes": 0}, "LabConfig.nodes"),
        ({"nproc_per_node": 9}, "LabConfig.nproc_per_node"),
        ({"prefix": "Sw"}, "LabConfig.prefix"),
        ({"prefix": "toolongname"}, "LabConfig.prefix"),
        ({"subnet": "10.213.0.0/29"}, "too small"),
        ({"subnet": "not-a-net"}, "LabConfig.subnet"),
        ({"prometheus_port": 19093}, "ports must differ"),
        ({"prometheus_port": 70000}, "LabConfig.prometheus_port"),
        ({"rdzv_port": 9400}, "ports inside a node must differ"),
        ({"agent_fault_port": 9400}, "ports inside a node must differ"),
        ({"startup_timeout": 0}, "LabConfig.startup_timeout"),
        ({"colour": "blue"}, "LabConfig.colour"),
    ],
)
def test_invalid_lab_config_names_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        LabConfig(**values)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"name": "has space"}, "JobSpec.name"),
        ({"name": "../escape"}, "JobSpec.name"),
        ({"name": "ok", "steps": 0}, "JobSpec.steps"),
        ({"name": "ok", "step_delay": -1}, "JobSpec.step_delay"),
        ({"name": "ok", "entrypoint": ()}, "JobSpec.entrypoint"),
        # The trainer takes seeds in [0, 2**63) only: every rank failed on --seed -1.
        ({"name": "ok", "seed": -1}, "JobSpec.seed"),
        ({"name": "ok", "seed": 2**63}, "JobSpec.seed"),
        ({"name": "ok", "step_delay": float("inf")}, "JobSpec.step_delay"),
        ({"name": "ok", "checkpoint_every": -1}, "JobSpec.checkpoint_every"),
        ({"name": "ok", "max_restarts": -1}, "JobSpec.max_restarts"),
        ({"steps": 3}, "JobSpec.name"),
    ],
)
def test_invalid_job_spec_names_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        JobSpec(**values)


def test_names_fit_linux_interface_limit() -> None:
    config = LabConfig(prefix="abcdefgh", nodes=8)
    names = [config.bridge, *(config.veth(i) for i in range(config.nodes))]
    assert all(len(name) <= 15 for name in names), names


def test_ownership_patterns_do_not_match_another_prefix() -> None:
    ours, other = LabConfig(prefix="sw"), LabConfig(prefix="swt1")
    assert ours.owns_link("swbr0") and ours.owns_link("swv1") and ours.owns_netns("sw-node3")
    for name in ("swt1br0", "swt1v0"):
        assert not ours.owns_link(name) and other.owns_link(name)
    assert not ours.owns_netns("swt1-node0")
    assert not ours.owns_link("eth0")


def test_state_round_trips_through_json(tmp_path: Any) -> None:
    config = LabConfig(subnet=ipaddress.IPv4Network("10.99.0.0/24"), prefix="rt")
    state = plan_state(RunPaths.of(tmp_path), config)
    again = LabState.model_validate_json(state.model_dump_json())
    assert again == state
    assert again.nodes[1].agent_url == "http://10.99.0.11:9400"
    assert again.nodes[1].agent_fault_url == "http://10.99.0.11:9401"
    assert again.prometheus_url == "http://127.0.0.1:19090"
    assert again.agent_token_file == tmp_path.resolve() / "secrets" / "agent.token"


def test_lab_train_refuses_a_negative_seed(tmp_path: Any) -> None:
    result = CliRunner().invoke(
        lab, ["train", "--run-dir", str(tmp_path), "--job", "j", "--steps", "3", "--seed", "-1"]
    )
    assert isinstance(result.exception, ConfigError)
    assert "JobSpec.seed" in str(result.exception)


@pytest.mark.parametrize(
    ("extra", "error", "said"),
    [
        (["--min-nodes", "0"], ConfigError, "JobSpec.min_nodes"),
        (["--min-nodes", "99"], ConfigError, "JobSpec.min_nodes"),
        (["--min-nodes", "1"], LabNotUpError, "no lab in"),
        ([], LabNotUpError, "start one with `stormwatch lab up`"),
    ],
    ids=["min-nodes-0", "min-nodes-above-any-lab", "valid-but-no-lab", "no-lab"],
)
def test_lab_train_without_a_lab_says_so_and_leaves_no_run_dir(
    tmp_path: Any, extra: list[str], error: type[Exception], said: str
) -> None:
    run_dir = tmp_path / "no-lab-here"
    result = CliRunner().invoke(
        lab, ["train", "--run-dir", str(run_dir), "--job", "j", "--steps", "3", *extra]
    )
    assert isinstance(result.exception, error), result.output
    assert said in str(result.exception)
    assert not run_dir.exists(), "a failed `lab train` must not create the run directory"
