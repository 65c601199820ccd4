"""Incident post-mortems cross-check the culprit with the chaos journals that overlap the
incident: only those of the incident's own training job (found on the shared Slurm lab,
where an experiment on another job ended a minute before a hang and its faulted rank was
given as this hang's chaos-faulted rank)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stormwatch.alerts.incident_report.sources import gather
from stormwatch.contracts.journal import JobRef, Journal

ALERT_AT = 1_796_000_000.0


def _journal(run_dir: Path, experiment_id: str, job: str | None, started_at: float) -> None:
    folder = run_dir / "experiments" / experiment_id
    folder.mkdir(parents=True)
    ref = None
    if job is not None:
        ref = JobRef(name=job, log_dir=run_dir / "jobs" / job, world_size=2, started_by_runner=True)
    journal = Journal(
        experiment_id=experiment_id,
        title=experiment_id,
        file=Path(f"{experiment_id}.yaml"),
        experiment={},
        status="completed",
        started_at=started_at,
        ended_at=started_at + 60,
        job=ref,
    )
    (folder / "journal.json").write_text(journal.model_dump_json())


def test_only_journals_of_the_incidents_job_or_of_no_job_are_read(tmp_path: Path, kit: Any) -> None:
    run_dir = tmp_path / "run"
    _journal(run_dir, "kill-other-job", "pl-kill", ALERT_AT - 100)  # overlaps, another job
    _journal(run_dir, "hang-this-job", "pl-hang", ALERT_AT - 30)  # overlaps, this job
    _journal(run_dir, "partition", None, ALERT_AT - 50)  # overlaps, no job: node-level
    _journal(run_dir, "long-ago", "pl-hang", ALERT_AT - 10_000)  # this job, outside the window
    inputs = gather(
        kit.closed_incident("StormwatchTrainingHung", {"training_job": "pl-hang"}, ALERT_AT),
        [],
        [],
        now=ALERT_AT + 60,
        lab_run_dir=run_dir,
        prometheus_url=None,
    )
    assert sorted(j.experiment_id for j in inputs.journals) == ["hang-this-job", "partition"]
    assert inputs.inputs["chaos journals"].endswith("(2 overlapping; 1 of other jobs left out)")
