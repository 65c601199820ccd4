"""The experiment's post-mortem gives an alert the same times as the responder's (fresh-user finding)."""

from __future__ import annotations

import json
from pathlib import Path

from stormwatch.chaos.reports.evidence import (
    AlertEvidence,
    align_with_incidents,
    load_evidence,
    save_evidence,
)
from stormwatch.contracts.responder import IncidentRecord

LABELS = {
    "alertname": "StormwatchRankStalled",
    "training_job": "demo",
    "rank": "1",
    "severity": "critical",
}


def _incident(**member: object) -> IncidentRecord:
    """A closed incident of one member alert (the responder's record, as it serves it)."""
    fields = {
        "fingerprint": "f1", "alertname": "StormwatchRankStalled", "status": "resolved",
        "labels": LABELS, "annotations": {}, "group_key": "g", "ends_at": None,
        "joined_at": 100.0, "resolved_at": 120.0, **member,
    }  # fmt: skip
    return IncidentRecord.model_validate(
        {"id": 1, "group_key": "g", "group_labels": {}, "alertname": "StormwatchRankStalled",
         "status": "closed", "labels": LABELS, "annotations": {}, "starts_at": fields["starts_at"],
         "ends_at": fields["ends_at"], "opened_at": 100.0, "closed_at": 120.0,
         "first_alert": fields, "first_alert_tied": False, "members": [fields]}
    )  # fmt: skip


def test_an_alert_the_responder_recorded_takes_prometheus_s_starts_and_ends_at() -> None:
    seen = AlertEvidence(
        alertname="StormwatchRankStalled", labels=LABELS, firing_at=100.5, resolved_at=121.0
    )
    (aligned,) = align_with_incidents([seen], [_incident(starts_at=100.0, ends_at=119.0)])
    assert (aligned.firing_at, aligned.resolved_at, aligned.source) == (
        100.0,
        119.0,
        "alertmanager",
    )


def test_an_alert_the_responder_never_saw_keeps_the_alerts_series_times() -> None:
    other = {**LABELS, "rank": "3"}
    seen = AlertEvidence(alertname="StormwatchRankStalled", labels=other, firing_at=100.5)
    (kept,) = align_with_incidents([seen], [_incident(starts_at=100.0)])
    assert kept == seen
    still_firing = AlertEvidence(
        alertname="StormwatchRankStalled", labels=LABELS, firing_at=100.5, resolved_at=None
    )
    (aligned,) = align_with_incidents([still_firing], [_incident(starts_at=100.0)])
    assert (aligned.firing_at, aligned.resolved_at) == (100.0, None)


def test_evidence_saved_before_the_responders_records_still_loads(tmp_path: Path) -> None:
    """evidence.json written when the controller kept its own subset of the records."""
    old = {
        "collected_at": 130.0, "window_start": 90.0, "window_end": 130.0,
        "alerts": [{"alertname": "StormwatchRankStalled", "labels": LABELS, "firing_at": 100.0,
                    "resolved_at": 119.0, "source": "alertmanager"}],
        "prometheus_error": None, "responder_error": None,
        "incidents": [{"id": 1, "alertname": "StormwatchRankStalled", "status": "closed",
                       "labels": LABELS, "group_key": "g", "starts_at": 100.0, "ends_at": 119.0,
                       "opened_at": 101.0, "closed_at": 120.0,
                       "members": [{"alertname": "StormwatchRankStalled", "status": "resolved",
                                    "labels": LABELS, "starts_at": 100.0, "ends_at": 119.0}]}],
        "notifications": [{"id": 1, "received_at": 101.0, "group_key": "g", "status": "firing",
                           "alerts": 1, "new_alerts": 1}],
    }  # fmt: skip
    path = tmp_path / "evidence.json"
    path.write_text(json.dumps(old))
    evidence = load_evidence(path)
    [incident] = evidence.incidents
    assert (incident.opened_at, incident.closed_at, incident.group_key) == (101.0, 120.0, "g")
    assert incident.first_alert.starts_at == 100.0 and incident.members[0].ends_at == 119.0
    assert evidence.notifications[0].received_at == 101.0
    # What is saved now is the responder's records, and it loads back the same.
    save_evidence(evidence, path)
    assert load_evidence(path) == evidence
