"""Preflight on a target file's target says what the target runs and the fix in the
target file's terms (not the lab's): the attached job's ranks or the template's nodes x
slurm.nproc_per_node, and ``credentials.agent_token_file`` for kill_rank."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest

from stormwatch.chaos.clients.agent import AgentClient
from stormwatch.chaos.errors import LabNotReady
from stormwatch.chaos.execution.readiness import preflight
from stormwatch.chaos.experiment.loader import parse_experiment
from stormwatch.chaos.platform_target import slurm_target
from stormwatch.platforms import load_target_file
from stormwatch.platforms.slurm import SlurmCommands

TARGET = """\
platform: slurm
prometheus: {url: 'http://prometheus.example:9090'}
job: JOB
slurm: {nproc_per_node: 2}
"""

EXPERIMENT = """
version: 1
title: preflight
job: {name: pf, steps: 10, checkpoint_every: 5, world_size: WORLD}
steady_state_hypothesis:
  title: nothing
  probes:
    - name: progressing
      provider: {type: job, expect: progressing, window_seconds: 1}
method:
  - {type: action, name: fault, fault: {kind: kill_rank, rank: 0}}
rollbacks:
  - {type: revert, name: undo}
"""


class _FakeSlurm(SlurmCommands):
    """Answers the commands a slurm target runs, for job 42 (llm) on gpu[1-2]."""

    def __call__(self, argv: Sequence[str]) -> str:
        text = " ".join(argv)
        if text.startswith("squeue"):
            return "42|gpu[1-2]\n"
        if text.startswith("scontrol show hostnames"):
            return "gpu1\ngpu2\n"
        if text.startswith("scontrol --oneliner show node"):
            return "NodeName=gpu1 NodeAddr=gpu1\nNodeName=gpu2 NodeAddr=gpu2\n"
        raise AssertionError(text)


def _preflight(tmp_path: Path, job: str, world: int) -> None:
    (tmp_path / "train.sbatch").write_text("#!/bin/bash\n#SBATCH --nodes=3\nsrun true\n")
    path = tmp_path / "target.yaml"
    path.write_text(TARGET.replace("JOB", job))
    target = slurm_target(load_target_file(path), tmp_path, commands=_FakeSlurm())
    experiment = parse_experiment(EXPERIMENT.replace("WORLD", str(world)))
    no_agents = cast(AgentClient, None)  # asked only after the checks under test
    asyncio.run(preflight(experiment, target, prometheus=None, agents=no_agents))


@pytest.mark.parametrize(
    ("job", "named"),
    [
        (
            "{attach: {name: llm}}",
            "but Slurm job 42 (llm: 2 node(s) x 2 ranks, slurm.nproc_per_node) runs 4: "
            "attach to a job of that size (job.attach) or fix slurm.nproc_per_node",
        ),
        (
            "{submit: {template: train.sbatch}}",
            "but a job of train.sbatch (3 node(s), its #SBATCH --nodes, x 2 ranks, "
            "slurm.nproc_per_node) runs 6: change the template's #SBATCH --nodes",
        ),
    ],
)
def test_a_job_of_another_size_is_named_with_what_the_target_runs(
    tmp_path: Path, job: str, named: str
) -> None:
    with pytest.raises(LabNotReady) as caught:
        _preflight(tmp_path, job, world=8)
    assert named in str(caught.value)
    assert "lab" not in str(caught.value)


def test_kill_rank_without_a_token_file_names_the_target_files_field(tmp_path: Path) -> None:
    with pytest.raises(LabNotReady, match=r"set credentials\.agent_token_file in the target file"):
        _preflight(tmp_path, "{attach: {name: llm}}", world=4)
