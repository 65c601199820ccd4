"""``--dry-run`` on a target file says the target it resolved (the attached Slurm job, not
"the lab"), the job it attaches to instead of ``experiment-<run>``; ``chaos suite``
refuses a target that attaches to one job, before anything starts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from stormwatch.chaos.experiment.dryrun import ResolvedTarget, print_plan, resolved_from
from stormwatch.chaos.experiment.loader import load_experiment
from stormwatch.chaos.platform_target import slurm_target
from stormwatch.cli import main
from stormwatch.platforms import load_target_file
from stormwatch.platforms.slurm import SlurmCommands

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = REPO / "experiments" / "kill-rank.yaml"

TARGET = """\
platform: slurm
prometheus: {url: 'http://prometheus.example:9090'}
job: JOB
slurm: {nproc_per_node: 2}
"""


class _FakeSlurm(SlurmCommands):
    """Answers the commands a slurm target runs, for job 42 (train) on gpu[1-2]."""

    def __call__(self, argv: Sequence[str]) -> str:
        text = " ".join(argv)
        if text.startswith("squeue"):
            return "42|gpu[1-2]\n"
        if text.startswith("scontrol show hostnames"):
            return "gpu1\ngpu2\n"
        if text.startswith("scontrol --oneliner show node"):
            return "NodeName=gpu1\nNodeName=gpu2\nNodeName=gpu3\n"
        raise AssertionError(text)


def _target_file(tmp_path: Path, job: str) -> Path:
    (tmp_path / "train.sbatch").write_text("#!/bin/bash\n#SBATCH --nodes=2\nsrun true\n")
    path = tmp_path / "target.yaml"
    path.write_text(TARGET.replace("JOB", job))
    return path


def _plan(tmp_path: Path, job: str) -> str:
    path = _target_file(tmp_path, job)
    target = slurm_target(load_target_file(path), tmp_path, commands=_FakeSlurm())
    console = Console(record=True, width=200, highlight=False, soft_wrap=True)
    refused = print_plan(load_experiment(EXPERIMENT), EXPERIMENT, console, resolved_from(target))
    assert refused is None
    return console.export_text()


def test_the_dry_run_names_the_attached_job_and_its_shape(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "{attach: {name: train}}")
    assert "target: Slurm job 42 (train: 2 node(s) x 2 ranks, slurm.nproc_per_node)" in plan
    assert "job train (attached: the target's job.attach, not started)" in plan
    assert "4 ranks on 2 nodes (Slurm job 42" in plan
    assert "rank 1" in plan
    assert "experiment-<run>" not in plan and "the lab" not in plan


def test_the_dry_run_of_a_submitting_target_shows_no_nodes_before_sbatch(tmp_path: Path) -> None:
    """The agents are every node's; the job's nodes are known only once it is allocated."""
    plan = _plan(tmp_path, "{submit: {template: train.sbatch}}")
    assert "target: a job of train.sbatch (2 node(s), its #SBATCH --nodes, x 2 ranks" in plan
    assert "job experiment-<run>" in plan
    assert "the target's nodes are known once its job is allocated" in plan
    assert "gpu3" not in plan and "the lab" not in plan


def test_suite_refuses_an_attaching_target_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _target_file(tmp_path, "{attach: {name: train}}")
    run_dir = tmp_path / "run"
    suite = REPO / "experiments" / "suite"
    with pytest.raises(SystemExit) as exited:
        main(["chaos", "suite", str(suite), "--target", str(path), "--run-dir", str(run_dir)])
    out = capsys.readouterr()
    output = out.out + out.err
    assert exited.value.code == 2, output
    assert "job.attach: a suite starts one job per experiment" in output
    assert "give a target file with job.submit" in output and "Traceback" not in output
    assert not run_dir.exists()


def _plan_of_world(tmp_path: Path, world: int | None, target: ResolvedTarget | None) -> str:
    data = yaml.safe_load(EXPERIMENT.read_text())
    if world is None:
        del data["job"]["world_size"]
    else:
        data["job"]["world_size"] = world
    path = tmp_path / f"ws{world}.yaml"
    path.write_text(yaml.safe_dump(data))
    console = Console(record=True, width=400, highlight=False, soft_wrap=True)
    print_plan(load_experiment(path), path, console, target)
    return next(line for line in console.export_text().splitlines() if "job experiment" in line)


NO_LAB = ResolvedTarget("the lab in run", problem="no lab in run (no lab.json)")


@pytest.mark.parametrize("target", [None, NO_LAB], ids=["no-target", "lab-not-up"])
def test_the_dry_run_says_the_world_size_whose_nodes_only_the_run_knows(
    tmp_path: Path, target: ResolvedTarget | None
) -> None:
    """3 ranks do not split over the default lab's 2 job nodes: the job line said 'unknown until
    run time; not the target's', naming neither the world size nor what is unknown."""
    line = _plan_of_world(tmp_path, 3, target)
    assert line.endswith(
        "seed 0, 3 ranks (job.world_size); their nodes are known only at run time "
        "(3 ranks do not split evenly over the default lab's 2 job nodes)"
    ), line
    unset = _plan_of_world(tmp_path, None, target)
    assert unset.endswith(
        "seed 0, the world size is not in the job section: the target's, known at run time"
    ), unset


def test_the_dry_run_on_a_submitting_target_names_the_world_size_without_the_default_lab(
    tmp_path: Path,
) -> None:
    line = _plan_of_world(tmp_path, 3, ResolvedTarget("a job of train.sbatch"))
    assert line.endswith(
        "seed 0, 3 ranks (job.world_size); the target's nodes are known once its job is allocated"
    ), line


def test_the_dry_run_lists_the_runner_s_own_recovery_check_after_a_kill(tmp_path: Path) -> None:
    """Fresh-user pass: `job-recovered` appeared in the run's output but not in its plan."""
    console = Console(record=True, width=400, highlight=False, soft_wrap=True)
    print_plan(load_experiment(EXPERIMENT), EXPERIMENT, console, None)
    lines = console.export_text().splitlines()
    [added] = [line for line in lines if "job-recovered" in line]
    assert added == (
        "    [after] job-recovered: every rank completes a step after the kill_rank; added by "
        "the runner, since that fault is over once sent, and checked first"
    )
    assert lines.index(added) < next(i for i, line in enumerate(lines) if line == "  method:")
