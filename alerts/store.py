"""Durable responder state in SQLite (WAL): notifications, incidents, actions.

Deduplication (FC-12) lives here, inside one transaction per notification:

* every alert delivery is keyed on (groupKey, fingerprint, startsAt, status);
  a key seen before changes nothing (Alertmanager retries, repeats, HA twins);
* an incident is keyed on (fingerprint, startsAt): the first firing opens it,
  the first resolved closes it; a firing after the resolve with the *same*
  startsAt is ignored, one with a new startsAt opens a new incident;
* an incident's actions are created with it, unique per (incident, kind), and
  are claimed (pending -> running) atomically, so no action runs twice, also
  across responder restarts (the database is the only state).

:class:`Store` is synchronous; the responder calls it from one worker thread
so that fsyncs never block the event loop.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stormwatch.alerts.errors import StoreError
from stormwatch.alerts.payload import WebhookAlert, WebhookMessage
from stormwatch.alerts.records import ActionRecord, IncidentRecord, NotificationRecord

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS notifications (
    id          INTEGER PRIMARY KEY,
    received_at REAL    NOT NULL,
    group_key   TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    receiver    TEXT    NOT NULL,
    alerts      INTEGER NOT NULL,
    new_alerts  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS deliveries (
    group_key       TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    starts_at_key   TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    notification_id INTEGER NOT NULL REFERENCES notifications (id),
    PRIMARY KEY (group_key, fingerprint, starts_at_key, status)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS incidents (
    id            INTEGER PRIMARY KEY,
    alertname     TEXT    NOT NULL,
    fingerprint   TEXT    NOT NULL,
    starts_at_key TEXT    NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('open', 'closed')),
    labels        TEXT    NOT NULL,
    annotations   TEXT    NOT NULL,
    group_key     TEXT    NOT NULL,
    starts_at     REAL    NOT NULL,
    ends_at       REAL,
    opened_at     REAL    NOT NULL,
    closed_at     REAL,
    UNIQUE (fingerprint, starts_at_key)
);
CREATE TABLE IF NOT EXISTS actions (
    id          INTEGER PRIMARY KEY,
    incident_id INTEGER NOT NULL REFERENCES incidents (id),
    kind        TEXT    NOT NULL,
    status      TEXT    NOT NULL
                CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'skipped')),
    created_at  REAL    NOT NULL,
    started_at  REAL,
    finished_at REAL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    detail      TEXT    NOT NULL DEFAULT '',
    data        TEXT    NOT NULL DEFAULT '{}',
    UNIQUE (incident_id, kind)
);
"""


@dataclass
class Ingested:
    """What one notification changed.

    Attributes:
        notification_id: row id of the stored notification.
        new_alerts: deliveries not seen before.
        duplicates: deliveries seen before (ignored).
        opened: ids of incidents this notification opened.
        closed: ids of incidents it closed.
        new_actions: ids of the actions created for the opened incidents (pending).
    """

    notification_id: int
    new_alerts: int = 0
    duplicates: int = 0
    opened: list[int] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)
    new_actions: list[int] = field(default_factory=list)


class Store:
    """The responder's SQLite database (created on first open, WAL, synchronous=FULL).

    Args:
        path: database file; its folder must exist.

    Raises:
        StoreError: the file cannot be opened as a responder database.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=10.0
            )
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, _SCHEMA_VERSION):
                raise StoreError(
                    f"{self.path}: responder database schema {version} is not supported "
                    f"(expected {_SCHEMA_VERSION}); use a new --db file"
                )
            with self._transaction():
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the responder database: {exc}") from exc

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- writes ---------------------------------------------------------------

    def ingest(
        self,
        message: WebhookMessage,
        *,
        received_at: float,
        actions_for: Callable[[str], Sequence[str]],
    ) -> Ingested:
        """Store one notification and apply its new deliveries, atomically.

        Args:
            message: the validated webhook payload.
            received_at: Unix seconds.
            actions_for: action kinds to create for a new incident of an alert name.

        Raises:
            StoreError: the database could not be updated (nothing was stored).
        """
        try:
            with self._transaction() as db:
                cur = db.execute(
                    "INSERT INTO notifications (received_at, group_key, status, receiver, alerts,"
                    " new_alerts) VALUES (?, ?, ?, ?, ?, 0)",
                    (
                        received_at,
                        message.group_key,
                        message.status,
                        message.receiver,
                        len(message.alerts),
                    ),
                )
                result = Ingested(notification_id=_rowid(cur))
                for alert in message.alerts:
                    cur = db.execute(
                        "INSERT OR IGNORE INTO deliveries (group_key, fingerprint, starts_at_key,"
                        " status, notification_id) VALUES (?, ?, ?, ?, ?)",
                        (
                            message.group_key,
                            alert.fingerprint,
                            alert.starts_at_key,
                            alert.status,
                            result.notification_id,
                        ),
                    )
                    if cur.rowcount != 1:
                        result.duplicates += 1
                        continue
                    result.new_alerts += 1
                    self._apply(
                        db, message, alert, result, now=received_at, actions_for=actions_for
                    )
                db.execute(
                    "UPDATE notifications SET new_alerts = ? WHERE id = ?",
                    (result.new_alerts, result.notification_id),
                )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot store the notification: {exc}") from exc
        return result

    def _apply(
        self,
        db: sqlite3.Connection,
        message: WebhookMessage,
        alert: WebhookAlert,
        result: Ingested,
        *,
        now: float,
        actions_for: Callable[[str], Sequence[str]],
    ) -> None:
        """Apply one new delivery to the incidents (inside the caller's transaction)."""
        incident = db.execute(
            "SELECT id, status FROM incidents WHERE fingerprint = ? AND starts_at_key = ?",
            (alert.fingerprint, alert.starts_at_key),
        ).fetchone()
        if alert.status == "firing":
            if incident is not None:
                return  # already open, or closed: a late duplicate of a resolved alert
            incident_id = self._insert_incident(db, message, alert, now=now, closed=False)
            result.opened.append(incident_id)
            for kind in actions_for(alert.alertname):
                cur = db.execute(
                    "INSERT OR IGNORE INTO actions (incident_id, kind, status, created_at)"
                    " VALUES (?, ?, 'pending', ?)",
                    (incident_id, kind, now),
                )
                if cur.rowcount == 1:
                    result.new_actions.append(_rowid(cur))
        elif incident is None:
            # Resolved before we saw it fire (the responder was down): record it closed,
            # run nothing.
            self._insert_incident(db, message, alert, now=now, closed=True)
        elif incident["status"] == "open":
            db.execute(
                "UPDATE incidents SET status = 'closed', closed_at = ?, ends_at = ? WHERE id = ?",
                (now, alert.ends_at_unix, incident["id"]),
            )
            result.closed.append(incident["id"])

    @staticmethod
    def _insert_incident(
        db: sqlite3.Connection,
        message: WebhookMessage,
        alert: WebhookAlert,
        *,
        now: float,
        closed: bool,
    ) -> int:
        cur = db.execute(
            "INSERT INTO incidents (alertname, fingerprint, starts_at_key, status, labels,"
            " annotations, group_key, starts_at, ends_at, opened_at, closed_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                alert.alertname,
                alert.fingerprint,
                alert.starts_at_key,
                "closed" if closed else "open",
                json.dumps(alert.labels, sort_keys=True),
                json.dumps(alert.annotations, sort_keys=True),
                message.group_key,
                alert.starts_at_unix,
                alert.ends_at_unix if closed else None,
                now,
                now if closed else None,
            ),
        )
        return _rowid(cur)

    def claim_action(self, action_id: int, *, now: float) -> bool:
        """Move a pending action to running; False when it is not pending (someone ran it).

        Raises:
            StoreError: the database could not be updated.
        """
        try:
            with self._transaction() as db:
                cur = db.execute(
                    "UPDATE actions SET status = 'running', started_at = ?, attempts = attempts + 1"
                    " WHERE id = ? AND status = 'pending'",
                    (now, action_id),
                )
                return cur.rowcount == 1
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot claim action {action_id}: {exc}") from exc

    def finish_action(
        self, action_id: int, *, status: str, detail: str, data: dict[str, Any], now: float
    ) -> None:
        """Record a running action's final state (``succeeded``, ``failed`` or ``skipped``).

        Raises:
            StoreError: the database could not be updated.
        """
        try:
            with self._transaction() as db:
                db.execute(
                    "UPDATE actions SET status = ?, detail = ?, data = ?, finished_at = ?"
                    " WHERE id = ? AND status = 'running'",
                    (status, detail, json.dumps(data), now, action_id),
                )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot finish action {action_id}: {exc}") from exc

    def recover(self, *, now: float, retry_safe: Callable[[str], bool]) -> list[int]:
        """After a restart: decide what happens to actions a previous run left unfinished.

        A ``running`` action was interrupted. If its kind is retry-safe (read-only,
        e.g. ``confirm_restart``) it goes back to ``pending``; otherwise it is
        marked ``failed`` and never re-run (at most once). Returns the ids of all
        ``pending`` actions, to be started.

        Raises:
            StoreError: the database could not be updated.
        """
        try:
            with self._transaction() as db:
                rows = db.execute(
                    "SELECT id, kind FROM actions WHERE status = 'running'"
                ).fetchall()
                for row in rows:
                    if retry_safe(row["kind"]):
                        db.execute(
                            "UPDATE actions SET status = 'pending' WHERE id = ?", (row["id"],)
                        )
                    else:
                        db.execute(
                            "UPDATE actions SET status = 'failed', finished_at = ?, detail = ?"
                            " WHERE id = ?",
                            (now, "interrupted by a responder restart; not retried", row["id"]),
                        )
                pending = db.execute(
                    "SELECT id FROM actions WHERE status = 'pending' ORDER BY id"
                ).fetchall()
            return [row["id"] for row in pending]
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot recover actions: {exc}") from exc

    # -- reads ----------------------------------------------------------------

    def notifications(self, *, limit: int) -> list[NotificationRecord]:
        """The latest ``limit`` notifications, oldest first."""
        rows = self._latest("notifications", limit)
        return [NotificationRecord(**dict(row)) for row in rows]

    def incidents(self, *, limit: int) -> list[IncidentRecord]:
        """The latest ``limit`` incidents, oldest first."""
        return [_incident(row) for row in self._latest("incidents", limit)]

    def incident(self, incident_id: int) -> IncidentRecord | None:
        """One incident, or None."""
        row = self._db.execute("SELECT * FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return None if row is None else _incident(row)

    def actions(self, *, limit: int) -> list[ActionRecord]:
        """The latest ``limit`` actions, oldest first."""
        return [_action(row) for row in self._latest("actions", limit)]

    def action(self, action_id: int) -> ActionRecord | None:
        """One action, or None."""
        row = self._db.execute("SELECT * FROM actions WHERE id = ?", (action_id,)).fetchone()
        return None if row is None else _action(row)

    def _latest(self, table: str, limit: int) -> list[sqlite3.Row]:
        # `table` is one of our own constant names, never user input.
        try:
            rows = self._db.execute(
                f"SELECT * FROM {table} ORDER BY id DESC LIMIT ?", (limit,)
            ).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read {table}: {exc}") from exc
        return rows[::-1]


def _rowid(cur: sqlite3.Cursor) -> int:
    rowid = cur.lastrowid
    if rowid is None:  # pragma: no cover - sqlite always sets it after an INSERT
        raise StoreError("INSERT returned no row id")
    return rowid


def _incident(row: sqlite3.Row) -> IncidentRecord:
    data = dict(row)
    data.pop("starts_at_key")
    data["labels"] = json.loads(data["labels"])
    data["annotations"] = json.loads(data["annotations"])
    return IncidentRecord(**data)


def _action(row: sqlite3.Row) -> ActionRecord:
    data = dict(row)
    data["data"] = json.loads(data["data"])
    return ActionRecord(**data)


__all__ = ["Ingested", "Store"]
