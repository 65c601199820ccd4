"""Both post-mortems show the restart's job-wide count beside the node-local ones."""

from __future__ import annotations

from stormwatch.postmortem.measures import measure_impact
from stormwatch.postmortem.progress import RankProgress, StepDone, WorkerStart, restart_after


def test_the_restart_shows_the_job_attempt_beside_node_counts_and_the_failed_node() -> None:
    """The second restart of a two-node job, caused by node1: node0's torchrun count stays 1
    (it restarted because its peer failed), node1's goes 0 -> 1, the job's attempt is 2."""
    progress = {
        0: RankProgress(
            rank=0,
            marks=(
                WorkerStart(time=1.0, attempt=1, job_attempt=1, restarted_by=("node0",)),
                StepDone(time=2.0, step=5, attempt=1, step_seconds=1.0),
                WorkerStart(
                    time=10.0,
                    attempt=1,
                    resumed_from_step=4,
                    job_attempt=2,
                    restarted_by=("node1",),
                ),
                StepDone(time=11.0, step=5, attempt=1, step_seconds=1.0),
            ),
        ),
        1: RankProgress(
            rank=1,
            marks=(
                WorkerStart(time=1.0, attempt=0, job_attempt=1, restarted_by=("node0",)),
                WorkerStart(
                    time=10.0,
                    attempt=1,
                    resumed_from_step=4,
                    job_attempt=2,
                    restarted_by=("node1",),
                ),
            ),
        ),
    }
    restart = restart_after(progress, 5.0)
    expected = (
        "restart 2 of the job (its nodes' torchrun counts: 1); restarted by a failure on node1"
    )
    assert restart.counts() == expected
    impact = measure_impact(progress, restart, onset=5.0, resolved_at=None)
    assert impact.restart == expected
    # a number for scripts (fresh-user finding: a `restart_count` holding a sentence)
    assert impact.restart_count == 2 and isinstance(impact.model_dump()["restart_count"], int)


def test_a_post_mortem_written_before_restart_count_was_a_number_still_reads() -> None:
    """Breaker: `plan --from-postmortems run/demo` refused the demo's older post-mortem."""
    from stormwatch.postmortem import ExperimentPostMortem
    from stormwatch.postmortem.measures import Impact

    older = "job attempt 1 (node-local counts 1); restarted by a failure on node0 (rank 1)"
    fields = {"experiment_id": "e", "title": "t", "status": "completed"}
    fields |= {"hypothesis_held": True, "rollbacks_ok": True, "restart_count": older}
    pm = ExperimentPostMortem.model_validate(fields)
    assert (pm.restart_count, pm.restart) == (1, older)
    newer = "restart 2 of the job (its nodes' torchrun counts: 1)"
    assert Impact.model_validate({"restart_count": newer}).restart_count == 2
    assert Impact.model_validate({"restart_count": "a restart of the job"}).restart_count is None
    assert Impact.model_validate({"restart_count": 3, "restart": "x"}).restart_count == 3
