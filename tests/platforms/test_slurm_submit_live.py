"""A Slurm target's ``job.submit`` on a real cluster (munged, slurmctld, three slurmd; the
shared fixture of tests/conftest.py with this module's own names and a free 10.220.x.0/24):
the template is submitted with the run's job shape, followed to COMPLETED by its job id,
and a cancelled job is read back gone."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest

from stormwatch.chaos.experiment.model import JobSection
from stormwatch.chaos.slurm_submit import SubmittedSlurmJobs
from stormwatch.lab.slurm import SlurmCluster
from stormwatch.platforms.targets import SubmitJob

pytestmark = [pytest.mark.e2e, pytest.mark.root]

SLURM_PREFIX = "swsub"
SLURM_SUBNET = "10.220"
SLURM_NODES = 3


def _jobs(cluster: SlurmCluster, tmp_path: Path, body: str) -> SubmittedSlurmJobs:
    template = tmp_path / "train.sbatch"
    template.write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --output={tmp_path}/%x-%j.out\n{body}\n"
    )
    return SubmittedSlurmJobs(
        cluster.commands,
        SubmitJob(template=template, parameters={"OUT": str(tmp_path)}),
        log_dirs=lambda name, job_id: tmp_path / f"{name}-{job_id}",
        nproc_per_node=1,
        stop_timeout_s=30.0,
    )


def _until(what: str, predicate: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_submitted_job_runs_the_template_with_the_runs_shape_and_completes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    jobs = _jobs(
        slurm_cluster, tmp_path, 'srun hostname >> "$OUT/hosts"\necho "$TRAIN_ARGS" > "$OUT/args"'
    )
    job = JobSection(name="sub-ok", steps=7, checkpoint_every=5, seed=2)
    ref = jobs.start(job)
    assert ref.started_by_runner and ref.world_size == 2
    _until("the job to end", lambda: jobs.ended("sub-ok"))
    assert jobs.exited("sub-ok") is True
    args = shlex.split((tmp_path / "args").read_text())
    assert args[args.index("--steps") + 1] == "7" and args[args.index("--job") + 1] == "sub-ok"
    assert len((tmp_path / "hosts").read_text().split()) == 2  # one task on each of 2 nodes
    assert jobs.log_dir("sub-ok") == ref.log_dir


def test_stop_cancels_a_submitted_job_and_reads_it_back_ended(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    jobs = _jobs(slurm_cluster, tmp_path, "srun sleep 300")
    jobs.start(JobSection(name="sub-stop", steps=1, checkpoint_every=1))
    _until("RUNNING", lambda: slurm_cluster.commands.jobs_named("sub-stop")[-1].state == "RUNNING")
    jobs.stop("sub-stop")
    assert jobs.exited("sub-stop") is False  # CANCELLED
