"""When the responder's stop of a job's ranks began, as a post-mortem reads it: a restart
for a hang waits for the hang's evidence before it signals any rank."""

from __future__ import annotations

from typing import Any

import pytest

from stormwatch.alerts.actions.remedial import EVIDENCE_WAIT_S
from stormwatch.alerts.incident_report.clues import stop_started_at
from stormwatch.alerts.incident_report.sources import Inputs
from stormwatch.contracts.responder import ActionRecord


def _inputs(kit: Any, alertname: str, claimed: float) -> Inputs:
    incident = kit.closed_incident(alertname, {"training_job": "j"}, at=1000.0)
    action = ActionRecord(
        id=1, incident_id=1, kind="restart_workers", status="succeeded", created_at=claimed,
        started_at=claimed, finished_at=claimed + 9, attempts=1, detail="", data={},
    )  # fmt: skip
    return Inputs(incident=incident, actions=[action], audit=[], window=(880.0, 1050.0))


@pytest.mark.parametrize(
    ("alertname", "claimed", "expected"),
    [
        # claimed 1 s after the alert, it signals no rank before the evidence wait is over
        ("StormwatchTrainingHung", 1001.0, 1000.0 + EVIDENCE_WAIT_S),
        ("StormwatchRankHungInPhase", 1001.0, 1000.0 + EVIDENCE_WAIT_S),
        # claimed after the wait: at once
        ("StormwatchTrainingHung", 1020.0, 1020.0),
        # no wait for an alert that is not a hang
        ("StormwatchRankCrashLoop", 1001.0, 1001.0),
    ],
)
def test_a_restart_for_a_hang_stops_ranks_only_after_the_evidence_wait(
    kit: Any, alertname: str, claimed: float, expected: float
) -> None:
    assert stop_started_at(_inputs(kit, alertname, claimed)) == pytest.approx(expected)
