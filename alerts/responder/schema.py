"""The responder database's layout: its versioned steps, and the checks that a ``--db``
file is the responder's before anything in it is changed.

Steps (``PRAGMA user_version`` = steps applied, :mod:`stormwatch.sqlite`):

1. notifications, deliveries, one incident per alert occurrence, actions (the first
   responder);
2. one incident per Alertmanager alert group, with its alerts as ``incident_members``:
   each schema-1 incident becomes an incident with its one alert as member (ids, actions
   and times kept). Schema 1 could hold several open incidents of one group; schema 2
   allows one, so the earliest stays open and the others are closed at migration time
   (their alerts keep their state and still resolve; no action runs again);
3. the append-only ``audit`` table (:mod:`stormwatch.alerts.responder.audit`), which the
   audit log used to create on its own, outside the versioned layout;
4. at most one audit entry per action and event (``resumed`` excepted): a trigger refuses
   a second one, so a bug that would audit an action twice aborts its transaction instead.
   Entries written before (older responders could repeat one after a crash) stay.

A new database takes the four steps in turn; a database of an older version takes the
ones it lacks when the responder (or ``stormwatch alerts postmortem``) opens it. A file that
is not the responder's (another program's SQLite, the agent's fault ledger) is refused
with :class:`NotAResponderDatabase` and left untouched.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from stormwatch.alerts.errors import NotAResponderDatabase, StoreError
from stormwatch.errors import SchemaTooNewError
from stormwatch.sqlite import (
    Migration,
    Schema,
    check_not_newer,
    connect,
    enable_wal,
    migrate,
    statements,
    user_version,
)

_V1_TABLES = """
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

_V2_GROUPED = """
CREATE TABLE incidents_grouped (
    id           INTEGER PRIMARY KEY,
    group_key    TEXT    NOT NULL,
    group_labels TEXT    NOT NULL,
    status       TEXT    NOT NULL CHECK (status IN ('open', 'closed')),
    alertname    TEXT    NOT NULL,
    opened_at    REAL    NOT NULL,
    closed_at    REAL
);
INSERT INTO incidents_grouped (id, group_key, group_labels, status, alertname, opened_at,
                               closed_at)
    SELECT id, group_key, '{}', status, alertname, opened_at, closed_at FROM incidents;
CREATE TABLE incident_members (
    fingerprint   TEXT    NOT NULL,
    starts_at_key TEXT    NOT NULL,
    incident_id   INTEGER NOT NULL REFERENCES incidents (id),
    alertname     TEXT    NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('firing', 'resolved')),
    labels        TEXT    NOT NULL,
    annotations   TEXT    NOT NULL,
    group_key     TEXT    NOT NULL,
    starts_at     REAL    NOT NULL,
    ends_at       REAL,
    joined_at     REAL    NOT NULL,
    resolved_at   REAL,
    PRIMARY KEY (fingerprint, starts_at_key)
) WITHOUT ROWID;
INSERT INTO incident_members (fingerprint, starts_at_key, incident_id, alertname, status,
                              labels, annotations, group_key, starts_at, ends_at, joined_at,
                              resolved_at)
    SELECT fingerprint, starts_at_key, id, alertname,
           CASE status WHEN 'closed' THEN 'resolved' ELSE 'firing' END,
           labels, annotations, group_key, starts_at, ends_at, opened_at, closed_at
    FROM incidents;
DROP TABLE incidents;
ALTER TABLE incidents_grouped RENAME TO incidents;
"""

_V2_INDEXES = """
CREATE UNIQUE INDEX incidents_one_open_per_group ON incidents (group_key) WHERE status = 'open';
CREATE INDEX incident_members_by_incident ON incident_members (incident_id);
"""

_V3_AUDIT = """
CREATE TABLE IF NOT EXISTS audit (
    id          INTEGER PRIMARY KEY,
    time        REAL    NOT NULL,
    actor       TEXT    NOT NULL,
    event       TEXT    NOT NULL,
    action_id   INTEGER,
    incident_id INTEGER,
    kind        TEXT    NOT NULL,
    job         TEXT,
    node        TEXT,
    reason      TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS audit_kind_time ON audit (kind, time);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
"""


_V4_AUDIT_ONCE = """
CREATE INDEX IF NOT EXISTS audit_action_event ON audit (action_id, event);
CREATE TRIGGER IF NOT EXISTS audit_once_per_action BEFORE INSERT ON audit
WHEN NEW.action_id IS NOT NULL AND NEW.event != 'resumed' AND EXISTS (
    SELECT 1 FROM audit WHERE action_id = NEW.action_id AND event = NEW.event)
BEGIN SELECT RAISE(ABORT, 'the audit log has this event of this action already'); END;
"""


def _group_incidents(conn: sqlite3.Connection) -> None:
    """Schema 1 -> 2: incidents per alert group, each old incident's alert its member."""
    for statement in statements(_V2_GROUPED):
        conn.execute(statement)
    conn.execute(
        "UPDATE incidents SET status = 'closed', closed_at = ? WHERE status = 'open' AND id"
        " NOT IN (SELECT MIN(id) FROM incidents WHERE status = 'open' GROUP BY group_key)",
        (time.time(),),
    )
    for statement in statements(_V2_INDEXES):
        conn.execute(statement)


#: What the fix is when the database is newer than this responder.
_OTHER_DB = "or start the responder with another --db file"

#: The responder database's layout.
SCHEMA = Schema(
    "responder database",
    (
        Migration(1, "notifications, deliveries, incidents per alert, actions", _V1_TABLES),
        Migration(
            2,
            "incidents per alert group, with members",
            upgrade=_group_incidents,
            rebuilds_tables=True,
        ),
        Migration(3, "append-only audit table", _V3_AUDIT),
        Migration(4, "one audit entry per action and event", _V4_AUDIT_ONCE),
    ),
    fix=_OTHER_DB,
)
#: The newest layout (``PRAGMA user_version``).
SCHEMA_VERSION = SCHEMA.version
#: The oldest layout a read-only open can read (incidents per group); an older database is
#: migrated by the next read-write open.
OLDEST_READABLE = 2

#: Tables of the first layout: a database without a version that has any of them is
#: another program's (ours always has a version).
_TABLES = ("notifications", "deliveries", "incidents", "incident_members", "actions")

#: What a ``--db`` file must be, in the errors of a file that is not one.
EXPECTED = (
    "expected the SQLite file the responder keeps (`stormwatch alerts serve --db FILE`; "
    "a lab's is <run-dir>/responder/responder.sqlite: run/responder/responder.sqlite for "
    "`stormwatch lab up`, run/demo/responder/responder.sqlite after `make demo`)"
)


def not_sqlite(path: Path) -> str:
    """The message for a file that is not SQLite at all."""
    return f"{path}: is not a SQLite database (so not a responder database); {EXPECTED}"


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return bool(row[0])


def check_ours(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a file that is not a responder database (nothing is changed).

    Raises:
        NotAResponderDatabase: no version but tables named like ours, or a version but no
            ``incidents`` table (another program's versioned file).
    """
    version = user_version(conn)
    if version == 0:
        clash = conn.execute(
            f"SELECT name FROM sqlite_master WHERE type = 'table' AND name IN "
            f"({', '.join('?' * len(_TABLES))})",
            _TABLES,
        ).fetchall()
        if clash:
            raise NotAResponderDatabase(
                f"{path}: is not a stormwatch responder database (no schema version, but it "
                f"has tables named like ours: {', '.join(_TABLES)}); pass another --db file"
            )
        return
    if not _has_table(conn, "incidents"):
        raise NotAResponderDatabase(
            f"{path}: is not a stormwatch responder database (schema version {version}, no "
            "incidents table: another program's file?); leave it alone and pass another --db file"
        )


def check_readable(conn: sqlite3.Connection, path: Path) -> None:
    """For a read-only open: the file is a responder database whose layout we can read.

    Raises:
        NotAResponderDatabase: an empty file, SQLite without our tables, or another
            program's file.
        StoreError: older than :data:`OLDEST_READABLE` (the responder migrates it when it
            opens it) or newer than this code.
    """
    version = user_version(conn)
    if version == 0 and not _has_table(conn, "incidents"):
        what = (
            "is an empty file"
            if path.stat().st_size == 0
            else "is a SQLite database without the responder's tables (no incidents)"
        )
        raise NotAResponderDatabase(f"{path}: {what}; {EXPECTED}")
    check_ours(conn, path)
    try:
        check_not_newer(version, SCHEMA, path)
    except SchemaTooNewError as exc:
        raise StoreError(str(exc)) from exc
    if version < OLDEST_READABLE:
        raise StoreError(
            f"{path}: responder database schema {version} is older than this responder's "
            f"schema {SCHEMA_VERSION}; it is migrated in place when the responder opens it "
            "(`stormwatch alerts serve --db FILE`), then it can be read"
        )


def open_responder_db(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """Open the responder database at ``path``: checked to be ours, then (read-write)
    switched to WAL and migrated to :data:`SCHEMA_VERSION`.

    Raises:
        NotAResponderDatabase: the file is not SQLite, or another program's SQLite (the
            message names the file and the fix); nothing in it was changed.
        StoreError: it cannot be opened or migrated, or was written by a newer stormwatch.
    """
    conn: sqlite3.Connection | None = None
    try:
        conn = connect(path, readonly=readonly, wal=False)
        if readonly:
            check_readable(conn, path)
        else:
            # Before WAL mode, which rewrites the file header: a file we refuse stays as it was.
            check_ours(conn, path)
            check_not_newer(user_version(conn), SCHEMA, path)
            enable_wal(conn)
            migrate(conn, SCHEMA, path=path)
            check_ours(conn, path)  # another process may have created it meanwhile
    except sqlite3.Error as exc:
        _close(conn)
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB:
            raise NotAResponderDatabase(not_sqlite(path)) from exc
        raise StoreError(f"{path}: cannot open the responder database: {exc}") from exc
    except SchemaTooNewError as exc:
        _close(conn)
        raise StoreError(str(exc)) from exc
    except StoreError:
        _close(conn)
        raise
    return conn


def _close(conn: sqlite3.Connection | None) -> None:
    if conn is not None:
        conn.close()


__all__ = [
    "EXPECTED",
    "OLDEST_READABLE",
    "SCHEMA",
    "SCHEMA_VERSION",
    "check_ours",
    "check_readable",
    "not_sqlite",
    "open_responder_db",
]
