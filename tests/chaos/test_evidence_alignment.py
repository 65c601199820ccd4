"""The experiment's post-mortem gives an alert the same times as the responder's (fresh-user finding)."""

from __future__ import annotations

from stormwatch.chaos.reports.evidence import AlertEvidence, align_with_incidents
from stormwatch.contracts.responder import IncidentRecord

LABELS = {"alertname": "StormwatchRankStalled", "job": "demo", "rank": "1", "severity": "critical"}


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
