"""The experiment's post-mortem gives an alert the same times as the responder's (fresh-user finding)."""

from __future__ import annotations

from stormwatch.chaos.clients.responder import Incident
from stormwatch.chaos.reports.evidence import AlertEvidence, align_with_incidents

LABELS = {"alertname": "StormwatchRankStalled", "job": "demo", "rank": "1", "severity": "critical"}


def _incident(**member: object) -> Incident:
    fields = {"alertname": "StormwatchRankStalled", "labels": LABELS, **member}
    return Incident.model_validate(
        {"id": 1, "alertname": "StormwatchRankStalled", "status": "closed", "opened_at": 100.0,
         "members": [fields]}
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
