"""The one way stormwatch opens its SQLite databases (fault ledgers, the responder's store).

* :func:`connect`: an autocommit connection (transactions are explicit) with a busy
  timeout, WAL journal, ``synchronous=FULL``, foreign keys on and :class:`sqlite3.Row`
  rows; or a read-only one (``mode=ro``: nothing in the file is created or written).
* :func:`transaction`: ``BEGIN IMMEDIATE`` (or ``DEFERRED`` for a read snapshot) ...
  ``COMMIT``, ``ROLLBACK`` on any exception.
* :func:`open_database`: both, then :func:`migrate`.
* :class:`Schema` / :class:`Migration`: a database's layout as an ordered list of steps;
  the database's ``PRAGMA user_version`` is the number of steps applied.
  :func:`migrate` applies the missing ones in one transaction, so opening an older
  database migrates it in place, and a database newer than the code is refused with
  :class:`~stormwatch.errors.SchemaTooNewError` naming the file and the fix, before
  anything is changed. A database is never deleted to get a new layout: a new layout is
  a new step.

Errors of SQLite itself (:class:`sqlite3.Error`) are left to the caller, which wraps them
once into its own error (``LedgerError``, ``StoreError``) with the file name.

Why these defaults: WAL lets readers (the CLI, a post-mortem) read while a writer writes;
``synchronous=FULL`` makes a committed row (a fault about to be injected) survive a power
loss, which WAL's default ``NORMAL`` does not; 10 s of busy timeout outlasts any of our
transactions (milliseconds) by far (https://www.sqlite.org/wal.html,
https://www.sqlite.org/pragma.html#pragma_synchronous).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from stormwatch.errors import SchemaTooNewError

#: Seconds a connection waits for another one's lock before failing with "database is locked".
DEFAULT_BUSY_TIMEOUT_S = 10.0

Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]


@dataclass(frozen=True)
class Migration:
    """One step of a database's layout.

    Attributes:
        version: the ``user_version`` after this step (steps are numbered 1, 2, 3, ...).
        summary: what the step changes, one line.
        sql: statements to run (several, separated by ``;``; triggers allowed).
        upgrade: Python run after ``sql``, on the connection inside the migration's
            transaction, for data that SQL alone cannot move.
        rebuilds_tables: the step drops or replaces a table other tables refer to; the
            migration then runs with foreign keys off and checks them before committing
            (SQLite's procedure for a table change, https://www.sqlite.org/lang_altertable.html).
    """

    version: int
    summary: str
    sql: str = ""
    upgrade: Callable[[sqlite3.Connection], None] | None = None
    rebuilds_tables: bool = False


@dataclass(frozen=True)
class Schema:
    """A database's layout: its name in messages and its migration steps, in order.

    Attributes:
        name: what the database is, for messages (``"fault ledger"``).
        migrations: steps 1..N; a new database runs them all.
        fix: what to tell the user of a database newer than this code (after "upgrade
            stormwatch"), e.g. ``"or start the responder with another --db file"``.

    Raises:
        ValueError: the steps are not numbered 1, 2, ..., N.
    """

    name: str
    migrations: tuple[Migration, ...]
    fix: str = ""

    def __post_init__(self) -> None:
        numbers = [m.version for m in self.migrations]
        if numbers != list(range(1, len(numbers) + 1)):
            raise ValueError(f"{self.name}: migrations must be numbered 1..N (got {numbers})")

    @property
    def version(self) -> int:
        """The newest version: the number of steps."""
        return len(self.migrations)


def connect(
    path: Path,
    *,
    readonly: bool = False,
    wal: bool = True,
    synchronous: Synchronous = "FULL",
    foreign_keys: bool = True,
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT_S,
    check_same_thread: bool = False,
) -> sqlite3.Connection:
    """Open ``path`` (created when missing, unless ``readonly``).

    Args:
        readonly: open with ``mode=ro``: the file must exist and nothing is written
            (no journal mode change, no schema).
        wal: switch the file to WAL (persistent; off to inspect a foreign file first,
            see :func:`enable_wal`).
        synchronous: ``PRAGMA synchronous`` of this connection.
        foreign_keys: enforce ``REFERENCES`` clauses.
        busy_timeout: seconds to wait for a lock held by another connection.
        check_same_thread: sqlite3's check; off by default because our callers serialise
            access themselves (a lock or one worker thread).

    Raises:
        sqlite3.Error: the file cannot be opened (the caller wraps it).
    """
    target = f"file:{quote(str(Path(path).resolve()))}?mode=ro" if readonly else str(path)
    conn = sqlite3.connect(
        target,
        uri=readonly,
        timeout=busy_timeout,
        isolation_level=None,
        check_same_thread=check_same_thread,
    )
    try:
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
        if wal and not readonly:
            enable_wal(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def enable_wal(conn: sqlite3.Connection) -> None:
    """Switch the database file to the WAL journal (a no-op when it is in WAL already)."""
    conn.execute("PRAGMA journal_mode=WAL")


@contextmanager
def transaction(
    conn: sqlite3.Connection, *, mode: Literal["DEFERRED", "IMMEDIATE"] = "IMMEDIATE"
) -> Iterator[sqlite3.Connection]:
    """One transaction on an autocommit connection (:func:`connect`).

    ``IMMEDIATE`` takes the write lock at ``BEGIN``, so a read-then-write cannot fail
    half-way on another writer; ``DEFERRED`` gives a read snapshot. Any exception rolls
    back and propagates.
    """
    conn.execute(f"BEGIN {mode}")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def user_version(conn: sqlite3.Connection) -> int:
    """The database's ``PRAGMA user_version`` (0 for a new file)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def check_not_newer(found: int, schema: Schema, path: Path) -> None:
    """Raise :class:`SchemaTooNewError` when version ``found`` is newer than ``schema``."""
    if found <= schema.version:
        return
    fix = f"upgrade stormwatch{', ' + schema.fix if schema.fix else ''}"
    raise SchemaTooNewError(
        f"{path}: {schema.name} schema {found} was written by a newer stormwatch (this one "
        f"reads schema {schema.version}); {fix}",
        path=path,
        found=found,
        known=schema.version,
    )


def statements(script: str) -> list[str]:
    """Split an SQL script into complete statements (a trigger body's ``;`` kept inside)."""
    found: list[str] = []
    buffer = ""
    for piece in script.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            if buffer.strip(" \t\n;"):
                found.append(buffer.strip())
            buffer = ""
    if buffer.strip(" \t\n;"):
        raise ValueError(f"incomplete SQL statement: {buffer.strip()[:80]!r}")
    return found


def migrate(conn: sqlite3.Connection, schema: Schema, *, path: Path) -> int:
    """Apply the steps of ``schema`` the database lacks, in one transaction; returns the
    version the database had.

    Raises:
        SchemaTooNewError: the database is newer than ``schema`` (nothing changed).
        sqlite3.Error: a step failed (everything rolled back; the caller wraps it).
    """
    found = user_version(conn)
    check_not_newer(found, schema, path)
    pending = schema.migrations[found:]
    if not pending:
        return found
    rebuild = any(step.rebuilds_tables for step in pending)
    keys_on = bool(conn.execute("PRAGMA foreign_keys").fetchone()[0])
    if rebuild:
        conn.execute("PRAGMA foreign_keys=OFF")  # only outside a transaction
    try:
        with transaction(conn):
            found = user_version(conn)  # another process may have migrated meanwhile
            check_not_newer(found, schema, path)
            for step in schema.migrations[found:]:
                for statement in statements(step.sql):
                    conn.execute(statement)
                if step.upgrade is not None:
                    step.upgrade(conn)
                conn.execute(f"PRAGMA user_version={step.version}")
            if rebuild:
                broken = conn.execute("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise sqlite3.IntegrityError(
                        f"migration left {len(broken)} rows with a dangling reference "
                        f"(first: table {broken[0][0]}, row {broken[0][1]})"
                    )
    finally:
        if rebuild and keys_on:
            conn.execute("PRAGMA foreign_keys=ON")
    return found


def open_database(
    path: Path, schema: Schema, *, wal: bool = True, **options: Any
) -> sqlite3.Connection:
    """:func:`connect` to ``path`` (``options`` as there) and :func:`migrate` it to ``schema``.

    The version is checked before the file is switched to WAL (which rewrites its header),
    so a database that is refused is left byte for byte as it was.

    Raises:
        SchemaTooNewError: the database is newer than ``schema`` (nothing changed).
        sqlite3.Error: the file cannot be opened or migrated (the caller wraps it).
    """
    conn = connect(path, wal=False, **options)
    try:
        check_not_newer(user_version(conn), schema, path)
        if wal:
            enable_wal(conn)
        migrate(conn, schema, path=path)
    except BaseException:
        conn.close()
        raise
    return conn


__all__ = [
    "DEFAULT_BUSY_TIMEOUT_S",
    "Migration",
    "Schema",
    "check_not_newer",
    "connect",
    "enable_wal",
    "migrate",
    "open_database",
    "statements",
    "transaction",
    "user_version",
]
