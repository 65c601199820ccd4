"""A Slurm target that submits each run's job from a batch script template
(``job.submit``): the options, environment and errors, against a recorded ``sbatch``;
the live half (a real cluster) is in tests/platforms/test_slurm_submit_live.py."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

import pytest

from stormwatch.chaos.errors import ChaosError
from stormwatch.chaos.experiment.model import JobSection
from stormwatch.chaos.platform_target import slurm_target
from stormwatch.chaos.slurm_submit import SubmittedSlurmJobs, template_nodes
from stormwatch.platforms.slurm import SlurmCommands
from stormwatch.platforms.targets import SubmitJob, parse_target_file

NODES = (
    "NodeName=node0 NodeAddr=10.1.0.10 State=IDLE\n"
    "NodeName=node1 NodeAddr=10.1.0.11 State=IDLE\n"
    "NodeName=node2 NodeAddr=10.1.0.12 State=IDLE\n"
)


class Recorded:
    """A cluster that answers ``scontrol show node``, ``sbatch`` and ``scontrol show job``."""

    def __init__(self, state: str = "RUNNING") -> None:
        self.calls: list[list[str]] = []
        self.state = state

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        if argv[:4] == ["scontrol", "--oneliner", "show", "node"]:
            return NODES
        if argv[0] == "sbatch":
            return "4242\n"
        if argv[:4] == ["scontrol", "--oneliner", "show", "job"]:
            return f"JobId=4242 JobName=exp JobState={self.state} NodeList=node[0-1]\n"
        return ""


def _template(tmp_path: Path, header: str = "#SBATCH --nodes=2\n") -> Path:
    script = tmp_path / "train.sbatch"
    script.write_text("#!/bin/bash\n# a comment\n" + header + "srun true\n#SBATCH --nodes=9\n")
    return script


def _job(**fields: object) -> JobSection:
    return JobSection.model_validate({"name": "exp", "steps": 30, "checkpoint_every": 10, **fields})


def test_the_node_count_comes_from_the_header_and_stops_at_the_first_command(
    tmp_path: Path,
) -> None:
    assert template_nodes(_template(tmp_path)) == 2
    assert template_nodes(_template(tmp_path, "#SBATCH -N 3\n")) == 3
    assert template_nodes(_template(tmp_path, "#SBATCH --nodes=2-4\n")) == 2
    assert template_nodes(_template(tmp_path, "")) == 1  # sbatch's default; not the 9 after srun


def test_a_submitting_target_lists_every_nodes_agent_and_attaches_to_nothing(
    tmp_path: Path,
) -> None:
    text = (
        "platform: slurm\nslurm: {nproc_per_node: 2}\n"
        "prometheus: {url: 'http://127.0.0.1:9090'}\n"
        "agents: {port: 9402, host: '{addr}'}\n"
        f"job: {{submit: {{template: {_template(tmp_path)}, parameters: {{A: '1'}}}}, "
        "log_dir: '/shared/{job}-{jobid}/logs'}\n"
    )
    cluster = Recorded()
    target = slurm_target(parse_target_file(text), tmp_path, commands=SlurmCommands(runner=cluster))
    assert [a.url for a in target.agents] == [f"http://10.1.0.1{i}:9402" for i in range(3)]
    assert target.attach_job is None
    assert target.world_size == 4
    assert not [c for c in cluster.calls if c[0] == "sbatch"]  # nothing submitted yet


def test_start_submits_the_template_with_the_jobs_shape_in_train_args(tmp_path: Path) -> None:
    cluster = Recorded()
    submit = SubmitJob(
        template=_template(tmp_path), parameters={"TRAIN_ARGS": "--tp 2", "SHARED": "/s"}
    )
    jobs = SubmittedSlurmJobs(
        SlurmCommands(runner=cluster),
        submit,
        log_dirs=lambda name, job_id: tmp_path / f"{name}-{job_id}",
        nproc_per_node=2,
    )
    env = jobs.environment(_job(seed=3, step_delay=0.25, global_batch=8))
    assert env["SHARED"] == "/s"
    args = shlex.split(env["TRAIN_ARGS"])
    assert args[:2] == ["--tp", "2"]  # the template's own options first, the job's after
    assert args[2:] == [
        "--job", "exp", "--steps", "30", "--checkpoint-every", "10", "--seed", "3",
        "--step-delay", "0.25", "--global-batch", "8",
    ]  # fmt: skip
    ref = jobs.start(_job(nodes=2))
    assert cluster.calls[-1] == [
        "sbatch", "--parsable", "--job-name=exp", "--nodes=2", str(submit.template)
    ]  # fmt: skip
    assert (ref.log_dir, ref.world_size, ref.started_by_runner) == (tmp_path / "exp-4242", 4, True)
    assert jobs.exited("exp") is None
    cluster.state = "COMPLETED"
    assert jobs.exited("exp") is True and jobs.ended("exp")
    cluster.state = "NODE_FAIL"
    assert jobs.exited("exp") is False


def test_a_job_command_is_submitted_as_the_recipes_command_with_its_placeholders_filled(
    tmp_path: Path,
) -> None:
    jobs = SubmittedSlurmJobs(
        SlurmCommands(runner=Recorded()),
        SubmitJob(template=_template(tmp_path), parameters={"TRAIN_ARGS": "--tp 2"}),
        log_dirs=lambda name, job_id: tmp_path,
        nproc_per_node=2,
    )
    command = ["python", "my train.py", "--max-steps=${steps}", "--name", "${job}"]
    env = jobs.environment(_job(command=command, step_delay=0.5))
    assert shlex.split(env["STORMWATCH_COMMAND"]) == [
        "python", "my train.py", "--max-steps=30", "--name", "exp"
    ]  # fmt: skip
    assert env["TRAIN_ARGS"] == "--tp 2"  # the trainer's options: untouched, unused


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"min_nodes": 1}, "job.min_nodes"), ({"world_size": 6}, "job.world_size")],
)
def test_a_job_the_template_cannot_run_is_refused_naming_the_field_and_nothing_is_submitted(
    tmp_path: Path, fields: dict[str, object], field: str
) -> None:
    cluster = Recorded()
    jobs = SubmittedSlurmJobs(
        SlurmCommands(runner=cluster),
        SubmitJob(template=_template(tmp_path)),
        log_dirs=lambda name, job_id: tmp_path,
        nproc_per_node=2,
    )
    with pytest.raises(ChaosError, match=field):
        jobs.start(_job(**fields))
    assert not [c for c in cluster.calls if c[0] == "sbatch"]


def test_stop_refuses_a_job_this_run_did_not_submit(tmp_path: Path) -> None:
    jobs = SubmittedSlurmJobs(
        SlurmCommands(runner=Recorded()),
        SubmitJob(template=_template(tmp_path)),
        log_dirs=lambda name, job_id: tmp_path,
        nproc_per_node=1,
    )
    with pytest.raises(ChaosError, match="not submitted by this run"):
        jobs.stop("someone-elses")
