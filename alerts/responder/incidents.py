"""Incidents per Alertmanager alert group: the SQL behind :meth:`Store.ingest`.

One incident is one episode of one alert group (the webhook's ``groupKey``):

* the first new firing alert of a group without an open incident opens one
  (at most one open incident per group: a partial unique index);
* later new firing alerts of the group join it as members, each with its own
  fingerprint, ``startsAt`` and labels;
* it closes when every member resolved, or when a notification with status
  ``resolved`` (Alertmanager's word that the whole group resolved) changes it;
* an alert occurrence (fingerprint + ``startsAt``) is a member of one incident
  only, ever: a firing for an occurrence already handled (an HA twin's resend
  after the resolve, the same alert routed into another group) changes nothing,
  a new occurrence after the close opens a new incident (FC-12);
* actions are created per incident: the union of the playbook's kinds for its
  members' alert names, unique per (incident, kind), so each runs once.

Every function here runs inside the caller's transaction; nothing commits.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from stormwatch.alerts.errors import StoreError
from stormwatch.alerts.responder.payload import WebhookAlert, WebhookMessage
from stormwatch.contracts.responder import IncidentMember, IncidentRecord


@dataclass
class Ingested:
    """What one notification changed.

    Attributes:
        notification_id: row id of the stored notification.
        new_alerts: deliveries not seen before.
        duplicates: deliveries seen before (ignored).
        opened: ids of incidents this notification opened.
        joined: ids of incidents that were already open and gained members.
        closed: ids of incidents it closed.
        new_actions: ids of the actions it created (pending).
    """

    notification_id: int
    new_alerts: int = 0
    duplicates: int = 0
    opened: list[int] = field(default_factory=list)
    joined: list[int] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)
    new_actions: list[int] = field(default_factory=list)


def rank_order(labels: dict[str, str]) -> tuple[int, int, str]:
    """Sort key of an alert's ``rank`` label: numeric ranks in order, then others, then none."""
    rank = labels.get("rank")
    if rank is None:
        return (2, 0, "")
    if rank.isdigit():
        return (0, int(rank), "")
    return (1, 0, rank)


def _alert_order(alert: WebhookAlert) -> tuple[float, tuple[int, int, str], str]:
    return (alert.starts_at_unix, rank_order(alert.labels), alert.fingerprint)


def _member_order(member: IncidentMember) -> tuple[float, tuple[int, int, str], str]:
    return (member.starts_at, rank_order(member.labels), member.fingerprint)


def apply_deliveries(
    db: sqlite3.Connection,
    message: WebhookMessage,
    alerts: Sequence[WebhookAlert],
    result: Ingested,
    *,
    now: float,
    actions_for: Callable[[str], Sequence[str]],
) -> None:
    """Apply a notification's new (not duplicate) alert deliveries to the incidents.

    Firing alerts go first (in first-alert order), so a notification carrying
    both resolved and firing alerts of a group without an open incident opens
    one incident, not a closed one plus an open one.

    Args:
        db: the connection, inside the caller's transaction.
        message: the notification (its ``groupKey``, ``status``, ``groupLabels``).
        alerts: the deliveries of ``message`` that were not seen before.
        result: updated in place.
        now: Unix seconds.
        actions_for: action kinds for an alert name.
    """
    firing = sorted((a for a in alerts if a.status == "firing"), key=_alert_order)
    resolved = sorted((a for a in alerts if a.status == "resolved"), key=_alert_order)
    touched = _join_firing(db, message, firing, result, now=now, actions_for=actions_for)
    touched |= _resolve(db, message, resolved, now=now)
    _close_finished(db, message, touched, result, now=now)


def _join_firing(
    db: sqlite3.Connection,
    message: WebhookMessage,
    firing: Sequence[WebhookAlert],
    result: Ingested,
    *,
    now: float,
    actions_for: Callable[[str], Sequence[str]],
) -> set[int]:
    """New firing alerts join the group's open incident (or open one) with their actions;
    returns the incidents touched."""
    touched: set[int] = set()
    for alert in firing:
        if _member_incident(db, alert) is not None:
            continue  # this occurrence was handled already (possibly in another group)
        incident_id = _open_incident(db, message.group_key)
        if incident_id is None:
            incident_id = _insert_incident(db, message, alert.alertname, now=now, closed=False)
            result.opened.append(incident_id)
        elif incident_id not in result.opened and incident_id not in result.joined:
            result.joined.append(incident_id)
        _insert_member(db, incident_id, message, alert, now=now)
        touched.add(incident_id)
        for kind in actions_for(alert.alertname):
            cur = db.execute(
                "INSERT OR IGNORE INTO actions (incident_id, kind, status, created_at)"
                " VALUES (?, ?, 'pending', ?)",
                (incident_id, kind, now),
            )
            if cur.rowcount == 1:
                result.new_actions.append(_rowid(cur))
    return touched


def _resolve(
    db: sqlite3.Connection, message: WebhookMessage, resolved: Sequence[WebhookAlert], *, now: float
) -> set[int]:
    """Mark resolved members; a resolve whose firing was never seen joins the open incident
    (or one closed incident recorded for them, which runs nothing). Returns incidents touched."""
    touched: set[int] = set()
    missed: int | None = None  # a closed incident for resolves whose firing we never saw
    for alert in resolved:
        member_of = _member_incident(db, alert)
        if member_of is not None:
            cur = db.execute(
                "UPDATE incident_members SET status = 'resolved', ends_at = ?, resolved_at = ?"
                " WHERE fingerprint = ? AND starts_at_key = ? AND status = 'firing'",
                (alert.ends_at_unix, now, alert.fingerprint, alert.starts_at_key),
            )
            if cur.rowcount == 1:
                touched.add(member_of)
            else:  # resolved before by the whole group's resolve: learn its endsAt
                db.execute(
                    "UPDATE incident_members SET ends_at = ? WHERE fingerprint = ?"
                    " AND starts_at_key = ? AND ends_at IS NULL",
                    (alert.ends_at_unix, alert.fingerprint, alert.starts_at_key),
                )
            continue
        incident_id = _open_incident(db, message.group_key)
        if incident_id is None:
            # The responder missed the firing (it was down, or the alert fired and
            # resolved within one group_interval): record it, run nothing.
            if missed is None:
                missed = _insert_incident(db, message, alert.alertname, now=now, closed=True)
            incident_id = missed
        _insert_member(db, incident_id, message, alert, now=now)
        touched.add(incident_id)
    return touched


def _close_finished(
    db: sqlite3.Connection,
    message: WebhookMessage,
    touched: set[int],
    result: Ingested,
    *,
    now: float,
) -> None:
    """Close each touched incident whose members all resolved (all of them, when
    Alertmanager says the whole group resolved)."""
    open_id = _open_incident(db, message.group_key)
    if message.status == "resolved" and open_id is not None and open_id in touched:
        # Alertmanager says the whole group resolved (members it did not list, e.g.
        # truncated ones, included).
        db.execute(
            "UPDATE incident_members SET status = 'resolved', resolved_at = ?"
            " WHERE incident_id = ? AND status = 'firing'",
            (now, open_id),
        )
    for incident_id in sorted(touched):
        cur = db.execute(
            "UPDATE incidents SET status = 'closed', closed_at = ? WHERE id = ?"
            " AND status = 'open' AND NOT EXISTS (SELECT 1 FROM incident_members"
            " WHERE incident_id = incidents.id AND status = 'firing')",
            (now, incident_id),
        )
        if cur.rowcount == 1:
            result.closed.append(incident_id)


def _member_incident(db: sqlite3.Connection, alert: WebhookAlert) -> int | None:
    row = db.execute(
        "SELECT incident_id FROM incident_members WHERE fingerprint = ? AND starts_at_key = ?",
        (alert.fingerprint, alert.starts_at_key),
    ).fetchone()
    return None if row is None else int(row[0])


def _open_incident(db: sqlite3.Connection, group_key: str) -> int | None:
    row = db.execute(
        "SELECT id FROM incidents WHERE group_key = ? AND status = 'open'", (group_key,)
    ).fetchone()
    return None if row is None else int(row[0])


def _insert_incident(
    db: sqlite3.Connection, message: WebhookMessage, alertname: str, *, now: float, closed: bool
) -> int:
    cur = db.execute(
        "INSERT INTO incidents (group_key, group_labels, status, alertname, opened_at, closed_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (
            message.group_key,
            json.dumps(message.group_labels, sort_keys=True),
            "closed" if closed else "open",
            alertname,
            now,
            now if closed else None,
        ),
    )
    return _rowid(cur)


def _insert_member(
    db: sqlite3.Connection,
    incident_id: int,
    message: WebhookMessage,
    alert: WebhookAlert,
    *,
    now: float,
) -> None:
    resolved = alert.status == "resolved"
    db.execute(
        "INSERT INTO incident_members (fingerprint, starts_at_key, incident_id, alertname, status,"
        " labels, annotations, group_key, starts_at, ends_at, joined_at, resolved_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            alert.fingerprint,
            alert.starts_at_key,
            incident_id,
            alert.alertname,
            alert.status,
            json.dumps(alert.labels, sort_keys=True),
            json.dumps(alert.annotations, sort_keys=True),
            message.group_key,
            alert.starts_at_unix,
            alert.ends_at_unix if resolved else None,
            now,
            now if resolved else None,
        ),
    )


def _rowid(cur: sqlite3.Cursor) -> int:
    rowid = cur.lastrowid
    if rowid is None:  # pragma: no cover - sqlite always sets it after an INSERT
        raise StoreError("INSERT returned no row id")
    return rowid


# -- reads ---------------------------------------------------------------------


def read_incidents(
    db: sqlite3.Connection, where: str, params: Sequence[object]
) -> list[sqlite3.Row]:
    """Incident rows matching ``where`` (our own constant SQL), oldest first."""
    return db.execute(f"SELECT * FROM incidents WHERE {where} ORDER BY id", params).fetchall()


def incident_records(
    db: sqlite3.Connection, rows: Iterable[sqlite3.Row], *, min_id: int
) -> list[IncidentRecord]:
    """Assemble :class:`IncidentRecord` s from incident rows with id >= ``min_id``.

    ``min_id`` bounds the member query (all of ``rows`` must have id >= it).
    """
    members: dict[int, list[IncidentMember]] = {}
    for row in db.execute(
        "SELECT * FROM incident_members WHERE incident_id >= ?", (min_id,)
    ).fetchall():
        data = dict(row)
        incident_id = data.pop("incident_id")
        data.pop("starts_at_key")
        data["labels"] = json.loads(data["labels"])
        data["annotations"] = json.loads(data["annotations"])
        members.setdefault(incident_id, []).append(IncidentMember(**data))
    return [_record(row, members.get(row["id"], [])) for row in rows]


def _common(maps: Sequence[dict[str, str]]) -> dict[str, str]:
    first, *rest = maps
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in rest)}


def _record(row: sqlite3.Row, members: list[IncidentMember]) -> IncidentRecord:
    if not members:  # pragma: no cover - an incident is inserted with its first member
        raise StoreError(f"incident {row['id']} has no member alerts")
    members.sort(key=_member_order)
    first = members[0]
    closed = row["status"] == "closed"
    ends = [m.ends_at for m in members if m.ends_at is not None]
    return IncidentRecord(
        id=row["id"],
        group_key=row["group_key"],
        group_labels=json.loads(row["group_labels"]),
        status=row["status"],
        alertname=row["alertname"],
        labels=_common([m.labels for m in members]),
        annotations=_common([m.annotations for m in members]),
        starts_at=first.starts_at,
        ends_at=max(ends) if closed and ends else None,
        opened_at=row["opened_at"],
        closed_at=row["closed_at"],
        first_alert=first,
        first_alert_tied=any(m.starts_at == first.starts_at for m in members[1:]),
        members=members,
    )


__all__ = [
    "Ingested",
    "apply_deliveries",
    "incident_records",
    "rank_order",
    "read_incidents",
]
