"""What the responder stores and serves: notifications, incidents and actions.

All times are Unix seconds (float), as everywhere in stormwatch's HTTP APIs.
These models are the JSON of ``GET /v1/notifications``, ``/v1/incidents`` and
``/v1/actions``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, JsonValue

IncidentStatus = Literal["open", "closed"]
ActionStatus = Literal["pending", "running", "succeeded", "failed", "skipped"]
#: Action states after which an action never runs again.
FINAL_ACTION_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "skipped"})


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NotificationRecord(_Record):
    """One webhook request the responder accepted (duplicates included).

    Attributes:
        id: row id, increasing in arrival order.
        received_at: Unix seconds.
        group_key: Alertmanager's ``groupKey``.
        status: the notification's ``status``.
        receiver: Alertmanager receiver name.
        alerts: number of alerts in the notification.
        new_alerts: alerts whose (groupKey, fingerprint, startsAt, status) was
            not seen before; the rest were duplicates and changed nothing.
    """

    id: int
    received_at: float
    group_key: str
    status: str
    receiver: str
    alerts: int
    new_alerts: int


class IncidentRecord(_Record):
    """One alert occurrence: opened by its first firing, closed by its resolution.

    An incident is identified by the alert's fingerprint and ``startsAt``; a
    later firing of the same alert (new ``startsAt``) is a new incident.

    Attributes:
        id: row id.
        alertname: the alert's name.
        fingerprint: Alertmanager's fingerprint of the label set.
        status: ``open`` or ``closed``.
        labels, annotations: as in the first notification seen.
        group_key: the ``groupKey`` of the first notification seen.
        starts_at: the alert's ``startsAt`` (Unix s).
        ends_at: the alert's ``endsAt`` from the resolved notification, or None.
        opened_at: when the responder opened the incident (Unix s).
        closed_at: when the responder closed it, or None while open.
    """

    id: int
    alertname: str
    fingerprint: str
    status: IncidentStatus
    labels: dict[str, str]
    annotations: dict[str, str]
    group_key: str
    starts_at: float
    ends_at: float | None
    opened_at: float
    closed_at: float | None


class ActionRecord(_Record):
    """One automatic action for an incident; runs at most once to a final state.

    Attributes:
        id: row id.
        incident_id: the incident it belongs to.
        kind: the action's kind, e.g. ``confirm_restart``.
        status: ``pending`` -> ``running`` -> ``succeeded``/``failed``/``skipped``.
        created_at: when the incident opened it (Unix s).
        started_at: start of the latest attempt, or None.
        finished_at: when it reached a final state, or None.
        attempts: number of starts (> 1 only for retry-safe actions resumed
            after a responder restart).
        detail: one human-readable line on the outcome.
        data: the action's structured output (JSON).
    """

    id: int
    incident_id: int
    kind: str
    status: ActionStatus
    created_at: float
    started_at: float | None
    finished_at: float | None
    attempts: int
    detail: str
    data: dict[str, JsonValue]


__all__ = [
    "FINAL_ACTION_STATUSES",
    "ActionRecord",
    "ActionStatus",
    "IncidentRecord",
    "IncidentStatus",
    "NotificationRecord",
]
