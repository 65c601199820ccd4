"""Where a Slurm target finds a job's rank logs (its attached job, a baseline job by name),
against a recorded ``scontrol`` through the one Slurm client's runner seam."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from stormwatch.chaos.errors import LabNotReady
from stormwatch.chaos.platform_target import AttachedSlurmJob, JobLogDirs, SlurmJobs
from stormwatch.platforms.slurm import SlurmCommands

JOBS = (
    "JobId=41 JobName=base JobState=COMPLETED NodeList=node[0-1] Restarts=0 ExitCode=0:0\n"
    "JobId=57 JobName=base JobState=COMPLETED NodeList=node[0-1] Restarts=0 ExitCode=0:0\n"
    "JobId=60 JobName=llm JobState=RUNNING NodeList=node[0-1] Restarts=0 ExitCode=0:0\n"
)


def _jobs(pattern: str | None, tmp_path: Path) -> SlurmJobs:
    def scontrol(argv: Sequence[str]) -> str:
        assert list(argv) == ["scontrol", "--oneliner", "show", "job"], argv
        return JOBS

    return SlurmJobs(
        SlurmCommands(runner=scontrol),
        AttachedSlurmJob("60", "llm", ("node0", "node1")),
        log_dirs=JobLogDirs(pattern, tmp_path),
        world_size=4,
    )


@pytest.mark.parametrize(
    ("pattern", "attached", "baseline"),
    [
        (None, "{run}/jobs/llm/logs", "{run}/jobs/base/logs"),
        ("/shared/{job}/logs", "/shared/llm/logs", "/shared/base/logs"),
        # {jobid}: the newest job of that name Slurm still knows.
        ("/shared/{job}-{jobid}/logs", "/shared/llm-60/logs", "/shared/base-57/logs"),
    ],
)
def test_a_slurm_target_finds_the_attached_and_a_baseline_jobs_rank_logs(
    tmp_path: Path, pattern: str | None, attached: str, baseline: str
) -> None:
    jobs = _jobs(pattern, tmp_path)

    assert jobs.attach("llm").log_dir == Path(attached.format(run=tmp_path))
    assert jobs.log_dir("base") == Path(baseline.format(run=tmp_path))


def test_a_job_id_pattern_for_a_job_slurm_does_not_know_says_so(tmp_path: Path) -> None:
    with pytest.raises(LabNotReady, match="needs the id of job 'other'; Slurm knows none"):
        _jobs("/shared/{jobid}/logs", tmp_path).log_dir("other")
