"""What the responder stores and serves: notifications, incidents and actions.

All times are Unix seconds (float), as everywhere in stormwatch's HTTP APIs.
These models are the JSON of ``GET /v1/notifications``, ``/v1/incidents`` and
``/v1/actions``: the responder (:mod:`stormwatch.alerts.responder`) writes them, and
:class:`stormwatch.clients.ResponderClient` reads them back (the CLI, the chaos
controller's evidence). They are declared here once, in the shared home, so that both
sides use the same models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, JsonValue

IncidentStatus = Literal["open", "closed"]
MemberStatus = Literal["firing", "resolved"]
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


class IncidentMember(_Record):
    """One alert occurrence (fingerprint + ``startsAt``) that belongs to an incident.

    Attributes:
        fingerprint: Alertmanager's fingerprint of the alert's label set.
        alertname: the alert's name.
        status: ``firing``, or ``resolved`` once the responder saw it resolve
            (or the whole group resolved).
        labels, annotations: as in the first notification that carried it.
        group_key: the ``groupKey`` of that notification.
        starts_at: the alert's ``startsAt`` (Unix s).
        ends_at: the alert's ``endsAt`` from its resolved notification, or None
            (still firing, or closed by a group-level resolve that did not list it).
        joined_at: when the responder added it to the incident (Unix s).
        resolved_at: when the responder saw it resolve (Unix s), or None.
    """

    fingerprint: str
    alertname: str
    status: MemberStatus
    labels: dict[str, str]
    annotations: dict[str, str]
    group_key: str
    starts_at: float
    ends_at: float | None
    joined_at: float
    resolved_at: float | None


class IncidentRecord(_Record):
    """One failure as Alertmanager grouped it: an episode of one alert group.

    An incident is per Alertmanager alert group (``groupKey``; the shipped
    configuration groups by ``alertname`` and ``training_job``). The first firing
    notification of a group without an open incident opens one; later firing
    alerts of the group join it as :attr:`members`; it closes when every member
    resolved, or when a ``resolved`` notification for the whole group arrives.
    A new alert occurrence of the group after that opens a new incident. An
    alert occurrence belongs to one incident only, so an old firing resent
    after its resolve (HA twin, retry) never reopens anything (FC-12).

    Attributes:
        id: row id.
        group_key: Alertmanager's ``groupKey`` of the group.
        group_labels: the group's ``groupLabels`` (e.g. ``alertname``, ``training_job``)
            from the notification that opened the incident.
        status: ``open`` or ``closed``.
        alertname: the name of the alert that opened the incident (every
            member's, when the group is grouped by ``alertname`` as shipped).
        labels: the labels every member has with the same value (like
            Alertmanager's ``commonLabels``): ``alertname``, ``training_job``, ``severity``,
            but not ``rank`` once two ranks alerted.
        annotations: the annotations every member shares.
        starts_at: the earliest member ``startsAt`` (= ``first_alert.starts_at``, Unix s).
        ends_at: the latest member ``endsAt`` once closed, or None.
        opened_at: when the responder opened the incident (Unix s).
        closed_at: when the responder closed it, or None while open.
        first_alert: the member that fired first: earliest ``startsAt``, ties
            broken by the numeric ``rank`` label (ranks without one last), then
            by fingerprint. Post-mortems use it to name the culprit rank.
        first_alert_tied: True when another member has the same ``startsAt``,
            so the rank order, not time, chose :attr:`first_alert` (alerts that
            turned true in the same rule evaluation); the culprit is then uncertain.
        members: every member, in :attr:`first_alert` order (``members[0]`` is it).
    """

    id: int
    group_key: str
    group_labels: dict[str, str]
    status: IncidentStatus
    alertname: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float | None
    opened_at: float
    closed_at: float | None
    first_alert: IncidentMember
    first_alert_tied: bool
    members: list[IncidentMember]


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


def incident_folder(postmortem_dir: Path, incident_id: int) -> Path:
    """Where the responder writes the post-mortem of incident ``incident_id``:
    ``<postmortem_dir>/incident-<id>`` (``postmortem.json``, ``.md``, then ``.html`` last)."""
    return Path(postmortem_dir) / f"incident-{incident_id}"


__all__ = [
    "FINAL_ACTION_STATUSES",
    "ActionRecord",
    "ActionStatus",
    "IncidentMember",
    "IncidentRecord",
    "IncidentStatus",
    "MemberStatus",
    "NotificationRecord",
    "incident_folder",
]
