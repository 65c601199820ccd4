"""Append-only audit log of the responder's actions: who/what did what, and why.

Every decision about a remedial or diagnostic action is one :class:`AuditEntry`,
written to the SQLite table ``audit`` in the responder's database (triggers
refuse UPDATE and DELETE) and appended as one JSON line to a JSONL file (for
log shippers). The guards (:mod:`stormwatch.alerts.responder.guards`) read their
durable state (budgets, rate limit, circuit breaker, approvals) back from it,
so they survive responder restarts.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from stormwatch.alerts.errors import StoreError
from stormwatch.alerts.responder.schema import open_responder_db

#: What happened: an action was admitted and started, refused (skipped), is
#: waiting for approval, was approved, ran in dry-run mode, or finished.
AuditEvent = Literal[
    "started", "skipped", "awaiting_approval", "approved", "dry_run", "succeeded", "failed"
]


class AuditEntry(BaseModel):
    """One audit record.

    Attributes:
        id: row id (0 before it is stored).
        time: Unix seconds.
        actor: who decided: ``responder`` (policy and guards) or the approver
            (``cli:<user>``, from ``stormwatch alerts approve``).
        event: see :data:`AuditEvent`.
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


class AuditLog:
    """The audit table plus its JSONL mirror; thread-safe (one lock).

    Args:
        db_path: the responder's SQLite database (opened, and migrated when older, as
            :class:`~stormwatch.alerts.responder.store.Store` does: the ``audit`` table is
            step 3 of :mod:`stormwatch.alerts.responder.schema`).
        jsonl_path: file to append JSON lines to, or None for the table only.

    Raises:
        StoreError: the database cannot be opened or migrated.
        NotAResponderDatabase: the file is another program's.
    """

    def __init__(self, db_path: Path, jsonl_path: Path | None = None) -> None:
        self.jsonl_path = jsonl_path
        self._lock = threading.Lock()
        self._db = open_responder_db(db_path)

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._db.close()

    def record(self, entry: AuditEntry) -> AuditEntry:
        """Append ``entry`` (table first, then the JSONL line); returns it with its id.

        Raises:
            StoreError: the table could not be written.
        """
        fields = entry.model_dump(exclude={"id"})
        with self._lock:
            try:
                cur = self._db.execute(
                    f"INSERT INTO audit ({', '.join(fields)}) VALUES "
                    f"({', '.join('?' * len(fields))})",
                    tuple(fields.values()),
                )
            except sqlite3.Error as exc:
                raise StoreError(f"cannot write the audit log: {exc}") from exc
            stored = entry.model_copy(update={"id": int(cur.lastrowid or 0)})
            if self.jsonl_path is not None:
                with self.jsonl_path.open("a", encoding="utf-8") as out:
                    out.write(stored.model_dump_json() + "\n")
        return stored

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
        rows = self._query(
            "SELECT 1 FROM audit WHERE action_id = ? AND event = ? LIMIT 1", [action_id, event]
        )
        return bool(rows)


__all__ = ["AuditEntry", "AuditEvent", "AuditLog"]
