"""The durable fault ledger: one SQLite file under ``--state-dir``.

Every fault the agent applies is recorded *before* it is applied (state
``injecting``), then ``applied`` with its expiry, then ``reverted`` with a
reason (``ttl``, ``request``, ``startup``, ``shutdown``) or ``failed``. A restarted agent
reads the ledger and reverts what expired or was left half-applied. Writes are
synchronous (WAL, ``synchronous=FULL``): a fault is on disk before it acts.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from stormwatch.agent.errors import LedgerError
from stormwatch.errors import SchemaTooNewError
from stormwatch.faults import Injection
from stormwatch.sqlite import Migration, Schema, open_database, transaction

_FAULTS_TABLE = """
CREATE TABLE IF NOT EXISTS faults (
    id            TEXT PRIMARY KEY,
    kind          TEXT NOT NULL,
    node          TEXT NOT NULL,
    spec          TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('injecting', 'applied', 'reverted', 'failed')),
    created_at    REAL NOT NULL,
    applied_at    REAL,
    expires_at    REAL NOT NULL,
    reverted_at   REAL,
    revert_reason TEXT,
    target_pid    INTEGER,
    details       TEXT NOT NULL DEFAULT '{}',
    error         TEXT
);
CREATE INDEX IF NOT EXISTS faults_state_expires ON faults (state, expires_at);
"""
#: The ledger's layout, one step per change (``PRAGMA user_version`` = steps applied).
SCHEMA = Schema(
    "fault ledger",
    (Migration(1, "faults table", _FAULTS_TABLE),),
    fix="or give this agent another --state-dir",
)


class FaultState(str, Enum):
    """Where a fault is in its life."""

    INJECTING = "injecting"
    APPLIED = "applied"
    REVERTED = "reverted"
    FAILED = "failed"


class FaultRecord(BaseModel):
    """One ledger row (also the JSON of the fault API, which the controller reads with this
    model too). Times are Unix seconds.

    Attributes:
        id, kind, node: identity.
        state: see :class:`FaultState`.
        spec: the validated request.
        created_at: when the agent recorded it; applied_at: when it took effect.
        expires_at: when the agent reverts it on its own.
        reverted_at, revert_reason: when and why (``ttl``, ``request``, ``startup``).
        target_pid, details: what :meth:`stormwatch.faults.Fault.inject` reported.
        error: last inject/revert error, if any.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    kind: str
    node: str
    state: FaultState
    spec: dict[str, Any]
    created_at: float
    applied_at: float | None
    expires_at: float
    reverted_at: float | None
    revert_reason: str | None
    target_pid: int | None
    details: dict[str, Any]
    error: str | None

    @property
    def active(self) -> bool:
        """Applied (or being applied) and not reverted."""
        return self.state in (FaultState.INJECTING, FaultState.APPLIED)

    @property
    def injection(self) -> Injection | None:
        """What ``inject`` returned, None when it never completed."""
        if self.applied_at is None:
            return None
        return Injection(target_pid=self.target_pid, details=dict(self.details))


class FaultLedger:
    """SQLite-backed store of :class:`FaultRecord` s; thread-safe.

    Args:
        path: database file (its directory is created, mode 0700).

    Raises:
        LedgerError: the file cannot be opened or migrated, or was written by a newer
            stormwatch (the message names the file and the fix).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise LedgerError(f"state_dir: cannot open fault ledger {self.path}: {exc}") from exc
        try:
            self._conn = open_database(self.path, SCHEMA)
        except SchemaTooNewError as exc:
            raise LedgerError(str(exc)) from exc
        except sqlite3.Error as exc:
            raise LedgerError(f"state_dir: cannot open fault ledger {self.path}: {exc}") from exc

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._conn.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                with transaction(self._conn) as conn:
                    yield conn
            except sqlite3.Error as exc:
                raise LedgerError(f"fault ledger {self.path}: {exc}") from exc

    # ---------------------------------------------------------------- writes
    def record_injecting(
        self,
        *,
        id: str,
        kind: str,
        node: str,
        spec: dict[str, Any],
        created_at: float,
        expires_at: float,
    ) -> FaultRecord:
        """Record a fault about to be applied.

        Raises:
            LedgerError: the id exists already (the manager checks first).
        """
        with self._tx() as db:
            db.execute(
                "INSERT INTO faults (id, kind, node, spec, state, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, 'injecting', ?, ?)",
                (id, kind, node, json.dumps(spec, sort_keys=True), created_at, expires_at),
            )
        return self._require(id)

    def mark_applied(
        self, id: str, *, applied_at: float, expires_at: float, injection: Injection
    ) -> FaultRecord:
        """The fault took effect."""
        with self._tx() as db:
            db.execute(
                "UPDATE faults SET state='applied', applied_at=?, expires_at=?, target_pid=?,"
                " details=?, error=NULL WHERE id=?",
                (
                    applied_at,
                    expires_at,
                    injection.target_pid,
                    json.dumps(dict(injection.details)),
                    id,
                ),
            )
        return self._require(id)

    def mark_failed(self, id: str, error: str) -> FaultRecord:
        """Applying the fault failed (nothing to revert)."""
        with self._tx() as db:
            db.execute("UPDATE faults SET state='failed', error=? WHERE id=?", (error, id))
        return self._require(id)

    def mark_reverted(
        self, id: str, *, at: float, reason: str, outcome: Mapping[str, Any] | None = None
    ) -> FaultRecord:
        """The fault was undone (or, for irreversible kinds, completed); ``outcome``: what
        the revert did (:meth:`stormwatch.faults.Fault.revert`), kept under ``details``'
        ``revert`` key."""
        with self._tx() as db:
            if outcome:
                row = db.execute("SELECT details FROM faults WHERE id=?", (id,)).fetchone()
                details = {**json.loads(row["details"] or "{}"), "revert": dict(outcome)}
                db.execute("UPDATE faults SET details=? WHERE id=?", (json.dumps(details), id))
            db.execute(
                "UPDATE faults SET state='reverted', reverted_at=?, revert_reason=?, error=NULL WHERE id=?",
                (at, reason, id),
            )
        return self._require(id)

    def note_error(self, id: str, error: str) -> None:
        """Remember a revert error (the fault stays active and is retried)."""
        with self._tx() as db:
            db.execute("UPDATE faults SET error=? WHERE id=?", (error, id))

    def delete(self, id: str) -> None:
        """Forget a fault that had no effect (its target vanished before inject)."""
        with self._tx() as db:
            db.execute("DELETE FROM faults WHERE id=?", (id,))

    # ----------------------------------------------------------------- reads
    def get(self, id: str) -> FaultRecord | None:
        """The record with ``id``, or None."""
        with self._tx() as db:
            row = db.execute("SELECT * FROM faults WHERE id=?", (id,)).fetchone()
        return None if row is None else _record(row)

    def _require(self, id: str) -> FaultRecord:
        record = self.get(id)
        if record is None:
            raise LedgerError(f"fault {id!r} vanished from the ledger")
        return record

    def all(self) -> list[FaultRecord]:
        """Every record, oldest first."""
        with self._tx() as db:
            rows = db.execute("SELECT * FROM faults ORDER BY created_at, id").fetchall()
        return [_record(row) for row in rows]

    def active(self) -> list[FaultRecord]:
        """Records in state ``injecting`` or ``applied``, oldest first."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT * FROM faults WHERE state IN ('injecting', 'applied') ORDER BY created_at, id"
            ).fetchall()
        return [_record(row) for row in rows]

    def counts(self) -> tuple[dict[str, int], dict[str, int], dict[tuple[str, str], int]]:
        """(active by kind, applied-ever by kind, reverted by (kind, reason))."""
        with self._tx() as db:
            active = db.execute(
                "SELECT kind, COUNT(*) FROM faults WHERE state IN ('injecting', 'applied') GROUP BY kind"
            ).fetchall()
            injected = db.execute(
                "SELECT kind, COUNT(*) FROM faults WHERE applied_at IS NOT NULL GROUP BY kind"
            ).fetchall()
            reverted = db.execute(
                "SELECT kind, revert_reason, COUNT(*) FROM faults WHERE state='reverted'"
                " GROUP BY kind, revert_reason"
            ).fetchall()
        return (
            {row[0]: row[1] for row in active},
            {row[0]: row[1] for row in injected},
            {(row[0], row[1] or ""): row[2] for row in reverted},
        )


def _record(row: sqlite3.Row) -> FaultRecord:
    data = dict(row)
    data["spec"] = json.loads(data["spec"])
    data["details"] = json.loads(data["details"] or "{}")
    return FaultRecord.model_validate(data)


__all__ = ["FaultLedger", "FaultRecord", "FaultState"]
