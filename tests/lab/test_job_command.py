"""A lab job's ``command``: a user's own training program, run by torchrun in place of
``stormwatch train`` and launched as the trainer is (through Slurm's recipe on the Slurm
lab, directly otherwise), with its folders in its environment. Without a lab: the command
lines and environments the lab hands to torchrun and to ``sbatch``. (The real run:
tests/telemetry/integrations/test_lightning_lab.py, a Lightning job on the Slurm lab.)"""

from __future__ import annotations

import ipaddress
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from stormwatch.errors import ConfigError
from stormwatch.lab import JobSpec, LabConfig
from stormwatch.lab.jobs import slurmjob, torchrun
from stormwatch.lab.paths import RunPaths
from stormwatch.lab.state import LabState, SlurmState, plan_state

COMMAND = ("/usr/bin/python3", "my train.py", "--max-steps", "50")


def _state(tmp_path: Path, scheduler: str = "slurm") -> LabState:
    state = plan_state(RunPaths(tmp_path), LabConfig(scheduler=scheduler))  # type: ignore[arg-type]
    if scheduler == "slurm":  # as `lab up` records the cluster it started
        state.slurm = SlurmState(
            conf=tmp_path / "slurm" / "slurm.conf",
            controller_address=ipaddress.IPv4Address("10.213.0.1"),
            controller_port=16817,
            partition="lab",
            nodes=[n.name for n in state.nodes],
        )
    return state


def test_a_command_job_runs_the_command_as_given_under_every_nodes_torchrun(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path, "direct")
    spec = JobSpec(name="pl", command=COMMAND, steps=7, seed=3)
    paths = RunPaths(tmp_path)
    for node_rank in (0, 1):
        line = torchrun.torchrun_command(state, spec, node_rank, paths, rdzv_port=29500)
        assert line[line.index("--no-python") + 1 :] == list(COMMAND)  # no trainer option
    env = torchrun.job_environment(spec, state.nodes[1], {"PATH": "/bin"}, paths)
    logs = paths.job_logs("pl")
    assert env["STORMWATCH_LOG_DIR"] == str(logs)
    assert env["STORMWATCH_DUMP_DIR"] == str(logs / "dumps")
    assert env["STORMWATCH_CHECKPOINT_DIR"] == str(paths.job_checkpoints("pl"))
    assert env["STORMWATCH_JOB"] == "pl"
    assert env["STORMWATCH_METRICS_DIR"] == str(state.nodes[1].metrics_dir)


def test_on_the_slurm_lab_a_command_job_goes_through_the_recipe_and_an_entrypoint_does_not(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path)
    paths = RunPaths(tmp_path)
    command = JobSpec(name="pl", command=COMMAND)
    assert slurmjob.uses_slurm(state, command)
    assert not slurmjob.uses_slurm(state, JobSpec(name="smoke", entrypoint=COMMAND))
    env = slurmjob.environment(state, command, paths, {}, 29500)
    assert shlex.split(env["STORMWATCH_COMMAND"]) == list(COMMAND)
    assert "TRAIN_ARGS" not in env
    trainer = slurmjob.environment(state, JobSpec(name="t", steps=9), paths, {}, 29500)
    assert "STORMWATCH_COMMAND" not in trainer
    assert "--steps 9" in trainer["TRAIN_ARGS"]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"command": ()}, "JobSpec.command: must name an executable"),
        ({"command": COMMAND, "entrypoint": COMMAND}, "give one (command for a training"),
        ({"command": COMMAND, "min_nodes": 1}, "remove min_nodes to run a command"),
        ({"command": COMMAND, "extra_args": ("--x",)}, "put the arguments in command"),
    ],
)
def test_a_command_that_cannot_run_is_refused_naming_the_field(
    fields: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        JobSpec(name="pl", **fields)
