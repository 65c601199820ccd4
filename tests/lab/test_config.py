"""LabConfig and JobSpec: validated at construction, errors name the field; derived names."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stormwatch.errors import ConfigError
from stormwatch.lab import JobSpec, LabConfig
from stormwatch.lab.cli import lab
from stormwatch.lab.errors import LabNotUpError
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.state import LabState, plan_state


def test_default_config_is_the_documented_lab() -> None:
    config = LabConfig()
    assert config.bridge == "swbr0"
    assert str(config.bridge_interface) == "10.213.0.1/24"
    # Issue 15: a two-node job and a spare node; a job's ranks are the two nodes' ranks.
    assert [config.netns(i) for i in range(config.nodes)] == ["sw-node0", "sw-node1", "sw-node2"]
    assert [str(config.node_address(i)) for i in range(2)] == ["10.213.0.10", "10.213.0.11"]
    assert config.world_size == 4
    assert config.job_nodes == 2 and JobSpec(name="j").node_count(config) == 2
    assert config.slurm and config.slurmctld_port == 16817
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
    assert "--seed: input should be greater than or equal to 0 (got -1)" in str(result.exception)


@pytest.mark.parametrize(
    ("extra", "error", "said"),
    [
        (["--min-nodes", "0"], ConfigError, "--min-nodes: input should be greater"),
        (["--min-nodes", "99"], ConfigError, "--min-nodes: input should be less"),
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


def test_lab_train_errors_name_the_flags_not_the_jobspec_fields(tmp_path: Any) -> None:
    args = ["--job", "bad name", "--steps", "0", "--max-restarts", "101", "--global-batch", "0"]
    result = CliRunner().invoke(lab, ["train", "--run-dir", str(tmp_path), *args])
    assert isinstance(result.exception, ConfigError)  # `stormwatch` prints it, exit status 2
    message = str(result.exception)
    for flag in ("--job", "--steps", "--max-restarts", "--global-batch"):
        assert f"{flag}: " in message
    assert "JobSpec" not in message and "(got 'bad name')" in message


def test_lab_train_min_nodes_above_the_labs_nodes_names_the_flag_and_the_fix(
    tmp_path: Any,
) -> None:
    from stormwatch.lab.state import StateStore

    paths = RunPaths.of(tmp_path)
    state = plan_state(paths, LabConfig(nodes=2))
    state.phase = "up"
    StateStore(paths).save(state)  # the lab.json `lab up` leaves; nothing is started
    result = CliRunner().invoke(
        lab, ["train", "--run-dir", str(tmp_path), "--job", "j", "--steps", "3", "--min-nodes", "3"]
    )
    assert isinstance(result.exception, ConfigError), result.output
    assert "--min-nodes: 3 is more than the lab's 2 nodes; pass --min-nodes 1..2" in str(
        result.exception
    )
    assert not (tmp_path / "jobs").exists()


def _exited(paths: RunPaths, name: str, code: int) -> Any:
    """A real supervised process (as the lab starts them) that has exited with ``code``."""
    import time

    from stormwatch.lab.services import procs

    paths.run_dir.mkdir(parents=True, exist_ok=True)
    record = procs.launch(
        name,
        ["sh", "-c", f"exit {code}"],
        log_file=paths.run_dir / f"{name.replace('/', '-')}.log",
        status_file=paths.run_dir / f"{name.replace('/', '-')}.status.json",
        env={"PATH": "/usr/bin:/bin", procs.LAB_MARKER_ENV: str(paths.run_dir)},
    )
    deadline = time.monotonic() + 20
    while not procs.is_finished(record):
        assert time.monotonic() < deadline, f"{name} did not exit"
        time.sleep(0.05)
    return record


def test_lab_status_keeps_one_line_per_row_at_80_columns(tmp_path: Any) -> None:
    """A lab whose `lab up` failed after starting services and a job: every row of
    every table stays on one line at 80 columns; 240 columns show everything."""
    import os
    import subprocess
    import sys
    import time

    from stormwatch.lab.state import JobInfo, JobRecord, StateStore

    paths = RunPaths.of(tmp_path / "run")
    state = plan_state(paths, LabConfig(nodes=2, prefix="swtcol"))
    state.phase = "failed"
    state.processes = {
        "agent-node0": _exited(paths, "agent-node0", 0),
        "prometheus": _exited(paths, "prometheus", 3),
    }
    name = "pretrain-llama-70b-elastic-with-a-long-job-name"
    job_dir = paths.run_dir / "jobs" / name
    state.jobs[name] = JobRecord(
        info=JobInfo(
            name=name,
            spec=JobSpec(name=name, steps=10),
            job_dir=job_dir,
            log_dir=job_dir / "logs",
            checkpoint_dir=job_dir / "checkpoints",
            node_pids={},
            node_logs={},
            started_at=time.time() - 125,
        ),
        processes={n: _exited(paths, f"{name}/{n}", c) for n, c in (("node0", 0), ("node1", 1))},
    )
    StateStore(paths).save(state)

    def status_at(columns: int) -> str:
        out = subprocess.run(
            [str(Path(sys.executable).with_name("stormwatch")), "lab", "status",
             "--run-dir", str(paths.run_dir)],
            capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": str(columns)},
        )  # fmt: skip
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr  # not healthy
        return out.stdout

    def rows(out: str) -> list[list[str]]:
        lines = [line for line in out.splitlines() if line.startswith("│")]
        return [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines]

    narrow = status_at(80)
    assert all(len(line) <= 80 for line in narrow.splitlines()), narrow
    node0, node1, prometheus, job = rows(narrow)  # 2 nodes, 1 service, 1 job: a line each
    assert node0[:4] == ["node0", "missing", str(state.processes["agent-node0"].pid), "exited"]
    assert node1[:3] == ["node1", "missing", "-"]
    assert prometheus[:3] == ["prometheus", str(state.processes["prometheus"].pid), "exited 3"]
    assert job[0].startswith("pretrain-llama") and job[1:] == ["ended", "node0=0, node1=1", "2m"]
    wide = status_at(240)  # the run dir sits under pytest's tmp_path (longer under xdist)
    node0, _, prometheus, job = rows(wide)
    assert node0[1:3] == ["swtcol-node0", str(LabConfig(nodes=2).node_address(0))]
    assert prometheus[-1] == state.prometheus_url + "/-/ready"
    assert job[0] == name and job[-1] == str(job_dir)


def test_lab_down_lists_only_what_a_sweep_reads_and_still_takes_up_s_options() -> None:
    shown = CliRunner().invoke(lab, ["down", "--help"])
    assert shown.exit_code == 0, shown.output
    assert "--prefix" in shown.output and "--no-slurm" in shown.output
    assert "--nodes" in shown.output  # a sweep with Slurm removes each node's runtime files
    for meaningless in ("--nproc-per-node", "--grace-period", "--scheduler", "--subnet"):
        assert meaningless not in shown.output
    # The flags of `lab up` are still accepted (parsed before --help acts; an unknown one
    # fails with exit 2): a script may pass one command line to both.
    up_flags = ["--nodes", "2", "--nproc-per-node", "1", "--grace-period", "3"]
    accepted = CliRunner().invoke(lab, ["down", *up_flags, "--help"])
    assert accepted.exit_code == 0, accepted.output
    assert CliRunner().invoke(lab, ["down", "--no-such-flag", "--help"]).exit_code == 2
