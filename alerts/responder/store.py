"""Durable responder state in SQLite (WAL): notifications, incidents, actions.

Deduplication (FC-12) lives here, inside one transaction per notification:

* every alert delivery is keyed on (groupKey, fingerprint, startsAt, status);
  a key seen before changes nothing (Alertmanager retries, repeats, HA twins);
* the new deliveries update the incidents, one per Alertmanager alert group
  (:mod:`stormwatch.alerts.responder.incidents`): an alert occurrence (fingerprint +
  startsAt) joins one incident only, ever;
* an incident's actions are created with it (or when a member with another
  alert name joins), unique per (incident, kind), and are claimed
  (pending -> running) atomically, so no action runs twice, also across
  responder restarts (the database is the only state);
* an action's final status and its audit entry are written in one transaction
  (:meth:`Store.finish_action`), and so are the recovery's decisions after a restart
  with theirs (:meth:`Store.recover`): a SIGKILL leaves both or neither, so no action is
  audited twice or run again after it finished.

The layout is versioned (:mod:`stormwatch.alerts.responder.schema`): an older
database is migrated in place when it is opened, a newer one is refused with a
message naming the file and the fix, another program's file is left untouched.

:class:`Store` is synchronous; the responder calls it from one worker thread
so that fsyncs never block the event loop.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from stormwatch.alerts.errors import NotAResponderDatabase, StoreError
from stormwatch.alerts.responder.audit import (
    OUTCOME_EVENTS,
    AuditEntry,
    AuditEvent,
    insert_entry,
)
from stormwatch.alerts.responder.incidents import (
    Ingested,
    apply_deliveries,
    incident_records,
    read_incidents,
)
from stormwatch.alerts.responder.payload import WebhookAlert, WebhookMessage
from stormwatch.alerts.responder.schema import EXPECTED, open_responder_db
from stormwatch.contracts.responder import ActionRecord, IncidentRecord, NotificationRecord
from stormwatch.sqlite import transaction

#: Builds the audit entry of a recovery decision: (event, kind, action id, incident, reason).
EntryFor = Callable[[AuditEvent, str, int, IncidentRecord, str], AuditEntry]
#: Final action status for an outcome event an older responder audited but did not store.
_OUTCOME_STATUS = {"succeeded": "succeeded", "dry_run": "succeeded", "failed": "failed"}


class Store:
    """The responder's SQLite database (created on first open, WAL, synchronous=FULL).

    Args:
        path: database file; its folder must exist.

    Raises:
        NotAResponderDatabase: the file is not SQLite, or another program's
            SQLite (the message names the file and the fix: another ``--db`` file).
        StoreError: the file cannot be opened or migrated, or it was written by a
            newer stormwatch (the message names the file and the fix).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._db = open_responder_db(self.path)

    @classmethod
    def open_readonly(cls, path: Path) -> Store:
        """Open an existing responder database for reading only (``alerts incidents --db``).

        Nothing in the database is created or written (SQLite ``mode=ro``), so this
        is safe on the database of a running responder and on a file that turns out
        to be another program's.

        Raises:
            NotAResponderDatabase: ``path`` does not exist, is a folder, is not
                SQLite, or has no responder schema (the message names the file and
                what was expected).
            StoreError: the schema is too old to read before the responder migrates it,
                newer than this code, or the file cannot be read.
        """
        path = Path(path)
        if not path.exists():
            raise NotAResponderDatabase(f"{path}: does not exist; {EXPECTED}")
        if not path.is_file():
            raise NotAResponderDatabase(f"{path}: is a folder, not a file; {EXPECTED}")
        store = cls.__new__(cls)
        store.path = path
        store._db = open_responder_db(path, readonly=True)
        return store

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return transaction(self._db)

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
            actions_for: action kinds to create for an incident with members of an
                alert name (each kind once per incident).

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
                new: list[WebhookAlert] = []
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
                    if cur.rowcount == 1:
                        new.append(alert)
                result.new_alerts = len(new)
                result.duplicates = len(message.alerts) - len(new)
                apply_deliveries(db, message, new, result, now=received_at, actions_for=actions_for)
                db.execute(
                    "UPDATE notifications SET new_alerts = ? WHERE id = ?",
                    (result.new_alerts, result.notification_id),
                )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot store the notification: {exc}") from exc
        return result

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
        self,
        action_id: int,
        *,
        status: str,
        detail: str,
        data: dict[str, Any],
        now: float,
        audit: AuditEntry | None = None,
    ) -> bool:
        """Record a running action's final state (``succeeded``, ``failed`` or ``skipped``)
        and its audit entry, in one transaction; False when it was not running (nothing
        written).

        Raises:
            StoreError: the database could not be updated (nothing was written).
        """
        try:
            with self._transaction() as db:
                cur = db.execute(
                    "UPDATE actions SET status = ?, detail = ?, data = ?, finished_at = ?"
                    " WHERE id = ? AND status = 'running'",
                    (status, detail, json.dumps(data), now, action_id),
                )
                if cur.rowcount != 1:
                    return False
                if audit is not None:
                    insert_entry(db, audit)
                return True
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot finish action {action_id}: {exc}") from exc

    def recover(
        self, *, now: float, retry_safe: Callable[[str], bool], entry: EntryFor | None = None
    ) -> list[int]:
        """After a restart: decide what happens to actions a previous run left unfinished.

        A ``running`` action was interrupted. What its audit entries say decides:

        * an outcome entry (written by an older responder, which stored it apart from
          the status): the action finished; its status is set from the entry, nothing
          runs or is audited again;
        * a retry-safe kind (read-only, e.g. ``confirm_restart``): back to ``pending``,
          audited ``resumed`` when it had started (it runs on, its ``started`` entry is
          not repeated);
        * otherwise ``failed``, audited ``failed``, never re-run (at most once).

        Each decision and its audit entry (built by ``entry``; None: no audit) are one
        transaction. Returns the ids of all ``pending`` actions, to be started.

        Raises:
            StoreError: the database could not be updated.
        """
        try:
            with self._transaction() as db:
                rows = db.execute(
                    "SELECT id, kind, incident_id FROM actions WHERE status = 'running'"
                ).fetchall()
                for row in rows:
                    _recover_one(db, row, now=now, retry_safe=retry_safe, entry=entry)
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
        """The latest ``limit`` incidents with their members, oldest first.

        Raises:
            StoreError: the database could not be read.
        """
        try:
            with self._read() as db:
                rows = db.execute(
                    "SELECT * FROM incidents ORDER BY id DESC LIMIT ?", (limit,)
                ).fetchall()[::-1]
                return incident_records(db, rows, min_id=rows[0]["id"]) if rows else []
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read incidents: {exc}") from exc

    def incident(self, incident_id: int) -> IncidentRecord | None:
        """One incident with its members, or None.

        Raises:
            StoreError: the database could not be read.
        """
        try:
            with self._read() as db:
                rows = read_incidents(db, "id = ?", (incident_id,))
                return incident_records(db, rows, min_id=incident_id)[0] if rows else None
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read incident {incident_id}: {exc}") from exc

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        """A read transaction: an incident and its members come from one snapshot."""
        return transaction(self._db, mode="DEFERRED")

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


def _recover_one(
    db: sqlite3.Connection,
    row: sqlite3.Row,
    *,
    now: float,
    retry_safe: Callable[[str], bool],
    entry: EntryFor | None,
) -> None:
    """:meth:`Store.recover` for one interrupted action, inside its transaction."""
    action_id, kind = int(row["id"]), str(row["kind"])
    events = [
        (r["event"], r["reason"])
        for r in db.execute(
            "SELECT event, reason FROM audit WHERE action_id = ? ORDER BY id", (action_id,)
        ).fetchall()
    ]
    outcomes = [(event, reason) for event, reason in events if event in OUTCOME_EVENTS]
    if outcomes:
        event, reason = outcomes[-1]
        db.execute(
            "UPDATE actions SET status = ?, detail = ?, finished_at = ? WHERE id = ?",
            (_OUTCOME_STATUS.get(event, "skipped"), reason, now, action_id),
        )
        return
    started = any(event == "started" for event, _ in events)
    audit: tuple[AuditEvent, str] | None
    if retry_safe(kind):
        db.execute("UPDATE actions SET status = 'pending' WHERE id = ?", (action_id,))
        audit = ("resumed", "interrupted by a responder restart; resumed") if started else None
    else:
        when = "while running" if started else "before it started"
        detail = f"interrupted by a responder restart {when}; not retried"
        db.execute(
            "UPDATE actions SET status = 'failed', finished_at = ?, detail = ? WHERE id = ?",
            (now, detail, action_id),
        )
        audit = ("failed", detail)
    if audit is not None and entry is not None:
        [incident] = incident_records(
            db, read_incidents(db, "id = ?", (row["incident_id"],)), min_id=row["incident_id"]
        )
        insert_entry(db, entry(audit[0], kind, action_id, incident, audit[1]))


def _rowid(cur: sqlite3.Cursor) -> int:
    rowid = cur.lastrowid
    if rowid is None:  # pragma: no cover - sqlite always sets it after an INSERT
        raise StoreError("INSERT returned no row id")
    return rowid


def _action(row: sqlite3.Row) -> ActionRecord:
    data = dict(row)
    data["data"] = json.loads(data["data"])
    return ActionRecord(**data)


__all__ = ["EntryFor", "Ingested", "Store"]
