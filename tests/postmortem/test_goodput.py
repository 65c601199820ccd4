"""Goodput and time lost are reckoned in the job's cadence, not a step's compute time alone
(fresh-user finding: the demo's job, 0.11 s steps plus a 0.3 s delay, read 13 % goodput;
by the step time alone a healthy job of it read 27 %)."""

from __future__ import annotations

import pytest

from stormwatch.postmortem.measures import measure_impact
from stormwatch.postmortem.progress import RankProgress, StepDone, WorkerStart, restart_after

#: Steps 1..20 every 0.4 s (0.1 s of it the step itself), a kill at 8.0, a restart at 12.0
#: from step 15, then steps 16..40 at the same cadence; the incident closes at 22.0.
ONSET, RESTART, CLOSED = 8.0, 12.0, 22.0


def _rank(rank: int) -> RankProgress:
    before = [StepDone(time=0.4 * s, step=s, step_seconds=0.1) for s in range(1, 21)]
    after = [
        StepDone(time=RESTART + 0.4 * (s - 15), step=s, attempt=1, step_seconds=0.1)
        for s in range(16, 41)
    ]
    start = WorkerStart(time=RESTART, attempt=1, resumed_from_step=15)
    return RankProgress(rank=rank, marks=(*before, start, *after))


def test_goodput_counts_the_steps_cadence() -> None:
    progress = {r: _rank(r) for r in range(2)}
    impact = measure_impact(
        progress, restart_after(progress, ONSET), onset=ONSET, resolved_at=CLOSED
    )
    assert impact.median_step_seconds == pytest.approx(0.1)
    assert impact.median_step_interval_seconds == pytest.approx(0.4)
    # new steps 21..40 (20), each worth a 0.4 s step of the job's cadence, over the 14 s
    # from onset to close: 0.57, where the step time alone (0.1 s) read 0.14
    assert impact.goodput == pytest.approx(20 * 0.4 / (CLOSED - ONSET))
    # steps lost 20 - 15 = 5; the job was back at step 20 at 14.0: 6 s lost
    assert impact.time_lost_seconds == pytest.approx(RESTART + 0.4 * 5 - ONSET)


def test_without_consecutive_steps_the_step_time_is_used() -> None:
    one = {0: RankProgress(rank=0, marks=(StepDone(time=1.0, step=1, step_seconds=0.1),))}
    impact = measure_impact(one, restart_after(one, 5.0), onset=5.0, resolved_at=10.0)
    assert impact.median_step_interval_seconds is None
    assert impact.median_step_seconds == pytest.approx(0.1)
