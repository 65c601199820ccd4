"""Append-only audit log of the responder's actions: who/what did what, and why.

Every decision about a remedial or diagnostic action is one :class:`AuditEntry`,
written to the SQLite table ``audit`` in the responder's database (triggers
refuse UPDATE and DELETE, and a second entry of one event for one action, except
``resumed``) and appended as one JSON line to a JSONL file (for log shippers). The
guards (:mod:`stormwatch.alerts.responder.guards`) read their durable state (budgets,
rate limit, circuit breaker, approvals) back from it, so they survive responder restarts.

Exactly once, across a crash: an entry that goes with a change of the action's status
(its outcome, the recovery after a restart) is written by
:class:`~stormwatch.alerts.responder.store.Store` in the same transaction as the status
(:func:`insert_entry`), so a SIGKILL leaves both or neither. The JSONL file is a mirror
of the table: :meth:`AuditLog.sync_mirror` appends the rows it lacks (by id), also those
committed by a responder killed before it could append them.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from stormwatch.alerts.errors import StoreError
from stormwatch.alerts.responder.schema import open_responder_db
from stormwatch.sqlite import transaction

#: What happened: an action was admitted and started, refused (skipped), is
#: waiting for approval, was approved, ran in dry-run mode, or finished.
AuditEvent = Literal[
    "started",
    "skipped",
    "awaiting_approval",
    "approved",
    "dry_run",
    "succeeded",
    "failed",
    "resumed",
]
#: Events that end an action (recorded with its final status, in one transaction).
OUTCOME_EVENTS: frozenset[str] = frozenset({"succeeded", "failed", "skipped", "dry_run"})


class AuditEntry(BaseModel):
    """One audit record.

    Attributes:
        id: row id (0 before it is stored).
        time: Unix seconds.
        actor: who decided: ``responder`` (policy and guards) or the approver
            (``cli:<user>``, from ``stormwatch alerts approve``).
        event: see :data:`AuditEvent` (``resumed``: a retry-safe action interrupted by a
            responder restart runs on; each other event at most once per action).
        action_id / incident_id: the responder's ids (None for none).
        kind: the action kind.
        job / node: what it acted on.
        reason: why (the alert, the guard that refused, the outcome's detail).
    """

    model_config = ConfigDict(frozen=True)

    id: int = 0
    time: float
    actor: str
    event: AuditEvent
    action_id: int | None = None
    incident_id: int | None = None
    kind: str
    job: str | None = None
    node: str | None = None
    reason: str = ""


def insert_entry(db: sqlite3.Connection, entry: AuditEntry) -> AuditEntry:
    """Insert ``entry`` on ``db`` inside the caller's transaction; returns it with its id.

    The caller commits (with the status change the entry belongs to) and then has the
    JSONL mirror catch up (:meth:`AuditLog.sync_mirror`). Raises :class:`sqlite3.Error`
    (the caller wraps it), also when the action has this event already.
    """
    fields = entry.model_dump(exclude={"id"})
    cur = db.execute(
        f"INSERT INTO audit ({', '.join(fields)}) VALUES ({', '.join('?' * len(fields))})",
        tuple(fields.values()),
    )
    return entry.model_copy(update={"id": int(cur.lastrowid or 0)})


class AuditLog:
    """The audit table plus its JSONL mirror; thread-safe (one lock).

    Args:
        db_path: the responder's SQLite database (opened, and migrated when older, as
            :class:`~stormwatch.alerts.responder.store.Store` does: the ``audit`` table is
            step 3 of :mod:`stormwatch.alerts.responder.schema`).
        jsonl_path: file to append JSON lines to, or None for the table only. Entries of
            the table it lacks (a responder killed between commit and append) are
            appended on open.

    Raises:
        StoreError: the database cannot be opened or migrated, or the JSONL file
            cannot be read or written.
        NotAResponderDatabase: the file is another program's.
    """

    def __init__(self, db_path: Path, jsonl_path: Path | None = None) -> None:
        self.jsonl_path = jsonl_path
        self._lock = threading.Lock()
        self._db = open_responder_db(db_path)
        self._mirrored = _last_mirrored_id(jsonl_path) if jsonl_path is not None else 0
        self.sync_mirror()

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()

    def record(self, entry: AuditEntry, *, once: bool = False) -> AuditEntry | None:
        """Append ``entry`` (table, then the JSONL mirror); returns it with its id.

        Args:
            once: record nothing (and return None) when the entry's action has an entry
                of this event already (decided inside the transaction: two concurrent
                approvals record one).

        Raises:
            StoreError: the table could not be written.
        """
        with self._lock:
            try:
                with transaction(self._db) as db:
                    if once and _has(db, entry.action_id, entry.event):
                        return None
                    stored = insert_entry(db, entry)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot write the audit log: {exc}") from exc
        self.sync_mirror()
        return stored

    def sync_mirror(self) -> None:
        """Append the table's entries the JSONL mirror lacks (ids above its last), in order.

        Raises:
            StoreError: the table cannot be read or the file written.
        """
        if self.jsonl_path is None:
            return
        with self._lock:
            try:
                rows = self._db.execute(
                    "SELECT * FROM audit WHERE id > ? ORDER BY id", (self._mirrored,)
                ).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read the audit log: {exc}") from exc
            if not rows:
                return
            lines = "".join(AuditEntry(**dict(row)).model_dump_json() + "\n" for row in rows)
            try:
                with self.jsonl_path.open("a", encoding="utf-8") as out:
                    out.write(lines)
            except OSError as exc:
                raise StoreError(f"{self.jsonl_path}: cannot append the audit log: {exc}") from exc
            self._mirrored = int(rows[-1]["id"])

    def _query(self, sql: str, args: Iterable[object]) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._db.execute(sql, tuple(args)).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read the audit log: {exc}") from exc

    def entries(self, *, limit: int = 1000, action_id: int | None = None) -> list[AuditEntry]:
        """The latest ``limit`` entries (of one action, when given), oldest first."""
        where, args = ("WHERE action_id = ?", [action_id]) if action_id is not None else ("", [])
        rows = self._query(
            f"SELECT * FROM (SELECT * FROM audit {where} ORDER BY id DESC LIMIT ?) ORDER BY id",
            [*args, limit],
        )
        return [AuditEntry(**dict(row)) for row in rows]

    def count(
        self, *, event: str, kinds: Iterable[str], since: float, job: str | None = None
    ) -> int:
        """Entries of ``event`` for ``kinds`` (and ``job``) at or after ``since``."""
        kinds = list(kinds)
        sql = (
            f"SELECT COUNT(*) FROM audit WHERE event = ? AND time >= ? "
            f"AND kind IN ({', '.join('?' * len(kinds))})"
        )
        args: list[object] = [event, since, *kinds]
        if job is not None:
            sql += " AND job = ?"
            args.append(job)
        return int(self._query(sql, args)[0][0])

    def last_outcomes(self, kind: str, n: int) -> list[AuditEntry]:
        """The latest ``n`` ``succeeded``/``failed`` entries of ``kind``, newest first."""
        rows = self._query(
            "SELECT * FROM audit WHERE kind = ? AND event IN ('succeeded', 'failed')"
            " ORDER BY id DESC LIMIT ?",
            [kind, n],
        )
        return [AuditEntry(**dict(row)) for row in rows]

    def has(self, action_id: int, event: str) -> bool:
        """Whether action ``action_id`` has an entry of ``event``."""
        with self._lock:
            try:
                return _has(self._db, action_id, event)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read the audit log: {exc}") from exc


def _has(db: sqlite3.Connection, action_id: int | None, event: str) -> bool:
    row = db.execute(
        "SELECT 1 FROM audit WHERE action_id = ? AND event = ? LIMIT 1", (action_id, event)
    ).fetchone()
    return row is not None


def _last_mirrored_id(path: Path) -> int:
    """The id of the last entry in the JSONL mirror (0: none, or no file).

    A torn last line (a kill during the append) is cut off, so the entry is appended
    again whole.

    Raises:
        StoreError: the file cannot be read or repaired.
    """
    try:
        with path.open("rb+") as file:
            end = file.seek(0, 2)
            start = max(0, end - 65536)  # an entry is far shorter; the last two fit
            file.seek(start)
            tail = file.read()
            lines = tail.split(b"\n")
            if lines[-1]:  # no newline at the end: torn
                file.truncate(end - len(lines[-1]))
            for line in reversed(lines[:-1]):
                if line.strip():
                    return int(json.loads(line)["id"])
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{path}: cannot read the audit log's JSONL mirror: {exc}") from exc
    return 0


__all__ = ["OUTCOME_EVENTS", "AuditEntry", "AuditEvent", "AuditLog", "insert_entry"]
